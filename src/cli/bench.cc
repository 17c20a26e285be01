// `diffucoder bench`: times generation on a checkpoint or on a synthetic model of a named shape and
// prints load time, ms per step (median, p10, p90), tokens/s, peak RSS, achieved GFLOP/s and that as
// a fraction of the bf16 GEMM peak measured in the same run (and the int8 peak, the q8 / q4 kernels'); with
// --profile, a step's time split into the layers' GEMMs, attention, the lm_head, the sampling and the rest.
// Progress on stderr. `--train` times
// optimizer steps instead (bench_train.cc).
#include <CLI/CLI.hpp>
#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "api/measure.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "ops/peak.h"

namespace dc::cli {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct BenchArgs {
  std::string model_dir, shape;
  int64_t prompt_len = 64, new_tokens = 256;
  int steps = 256, batch = 1, threads = 0, max_steps = 0;
  int64_t layers = 0, vocab = 0;  // --shape: SyntheticModel::layers / vocab
  std::string alg = "entropy";
  float temperature = 0.0f;
  uint64_t seed = 0;
  bool json = false, no_peak = false, fast = false, profile = false;
  int64_t block_length = 0;
  std::string cache = "none";
  int refresh_every = 4;
  float threshold = 0.0f, factor = 0.0f;
  std::string weights = "bf16", precision = "auto", weight_cache, lora, lora_mode = "merged";
  int64_t group_size = 128;
  std::string device = "cpu";
};

// FLOPs of the layers' GEMMs alone in forwards over `positions` computed positions (what the step breakdown's
// GEMM time computed).
double layer_gemm_flops(const diffucoder::ModelInfo& c, double positions) {
  const double q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim, E = c.hidden_size, F = c.intermediate_size;
  return c.n_layer * positions * 2.0 * (E * q + 2 * E * kv + q * E + 3 * E * F);
}

// FLOPs of one forward to the hidden rows: the GEMMs of every layer over the computed positions (the
// window with a KV cache) and their attention over all L keys (not the lm_head: the sampling runs it).
double forward_flops(const diffucoder::ModelInfo& c, const diffucoder::ForwardEvent& f) {
  const double T = static_cast<double>(f.positions), L = static_cast<double>(f.keys);
  const double attention = 4.0 * T * L * c.n_head * c.head_dim;  // q·kᵀ and p·v
  return layer_gemm_flops(c, T) + c.n_layer * attention;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1) + 0.5)];
}

// The flags checked before anything loads (every failure a usage error, exit 2).
Status check_bench_flags(const BenchArgs& a) {
  if (a.model_dir.empty() == a.shape.empty()) return invalid_argument("give exactly one of --model DIR or --shape NAME");
  DC_RETURN_IF_ERROR(check_reshape(a.shape, a.layers, a.vocab));
  if (!a.lora.empty() && a.model_dir.empty()) return invalid_argument("--lora needs --model (a --shape model has random weights)");
  if (a.prompt_len < 1 || a.new_tokens < 1 || a.steps < 1 || a.batch < 1)
    return invalid_argument("--prompt-len, --new-tokens, --steps and --batch must be >= 1");
  if (a.prompt_len > kMaxCanvasLength || a.new_tokens > kMaxCanvasLength || a.steps > kMaxSteps ||
      a.batch > kMaxGenerationRows || a.batch * (a.prompt_len + a.new_tokens) > kMaxCanvasLength)
    return invalid_argument("--prompt-len and --new-tokens must be <= " + std::to_string(kMaxCanvasLength) +
                            ", --steps <= " + std::to_string(kMaxSteps) + ", --batch <= " +
                            std::to_string(kMaxGenerationRows) + ", --batch × (--prompt-len + --new-tokens) <= " +
                            std::to_string(kMaxCanvasLength));
  DC_RETURN_IF_ERROR(parse_matmul_precision(a.precision).status());
  DC_RETURN_IF_ERROR(parse_device(a.device).status());
  if (a.profile && a.device != "cpu")
    return invalid_argument("--profile times the CPU's ops; on a device a step is one submission (see the device work "
                            "per step instead)");
  DC_RETURN_IF_ERROR(parse_lora_mode(a.lora_mode).status());
  if (a.weights == "q8" || a.weights == "q4") {
    if (!a.model_dir.empty())
      return invalid_argument("--weights " + a.weights + " applies to --shape models; quantize a checkpoint "
                              "once with `diffucoder convert --weights " + a.weights + "` and bench that");
  } else if (a.weights != "bf16") {
    return invalid_argument("--weights '" + a.weights + "' is not one of bf16, q8, q4");
  }
  DC_RETURN_IF_ERROR(parse_algorithm(a.alg).status());
  return parse_cache_mode(a.cache).status();
}

// The model of a --shape (random weights, bf16 or quantized) or of a --model checkpoint.
diffucoder::Result<std::unique_ptr<diffucoder::Model>> load_bench_model(const BenchArgs& a) {
  diffucoder::LoadOptions o;
  o.threads = a.threads;
  o.precision = a.precision;
  o.device = a.device;
  if (a.shape.empty()) {
    o.model_dir = a.model_dir;
    o.weight_cache = a.weight_cache;
    o.lora_dir = a.lora;
    o.lora_mode = a.lora_mode;
  } else {
    std::fprintf(stderr, "bench: building a random %s %s model...\n", a.weights.c_str(), a.shape.c_str());
    o.synthetic = diffucoder::SyntheticModel{a.shape, a.layers, a.vocab, a.weights, a.group_size, a.seed};
  }
  return diffucoder::Model::load(o);
}

// The generation config of the run: the model's defaults with the flags applied, --fast resolved, checked.
diffucoder::Result<diffucoder::GenerationConfig> bench_config(const BenchArgs& a, const diffucoder::Model& model) {
  diffucoder::GenerationConfig c = model.default_config();
  c.alg = a.alg;
  c.steps = a.steps;
  c.max_new_tokens = a.new_tokens;
  c.temperature = a.temperature;
  c.seed = a.seed;
  c.block_length = a.block_length;
  c.cache = a.cache;
  c.refresh_every = a.refresh_every;
  c.threshold = a.threshold;
  c.factor = a.factor;
  c.fast = a.fast;
  diffucoder::Result<diffucoder::GenerationConfig> resolved = diffucoder::resolve_fast(c);
  if (!resolved.ok()) return resolved;
  if (diffucoder::Status s = diffucoder::check_config(*resolved); !s.ok()) return s;
  return resolved;
}

// --batch prompts of --prompt-len random ids below min(n_vocab, 150000), none the mask: [batch][prompt_len].
std::vector<std::vector<int32_t>> random_prompts(const BenchArgs& a, int64_t n_vocab, int32_t mask_token_id) {
  std::mt19937 gen(static_cast<uint32_t>(a.seed));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(std::min<int64_t>(n_vocab, 150000) - 1));
  std::vector<std::vector<int32_t>> prompts(a.batch, std::vector<int32_t>(a.prompt_len));
  for (auto& prompt : prompts)
    for (auto& t : prompt) {
      do t = id(gen); while (t == mask_token_id);
    }
  return prompts;
}

// What one timed generation measured.
struct GenerationTiming {
  std::vector<double> step_ms;  // each step, from on_step to on_step
  double flops = 0, forward_ms = 0;  // the forwards' FLOPs (forward_flops) and their time
  int64_t forwards = 0, positions = 0;  // the forwards run and the positions (GEMM rows) they computed over all rows
  double first_forward_ms = -1;  // from the start of generation to the end of its first forward (-1: none)
  double gen_ms = 0;  // the whole generate()
  // The device's counters at the start and after the first step that ran a forward (which compiles the
  // pipelines and records the first command buffers; a step may commit without one): the work per step is the
  // later steps' when there are any.
  DeviceCounters at_start, after_first;
  int steps_to_first = 0;  // steps up to and including the first with a forward (0: none yet)
};

// Generates from `prompts` with every step and forward timed into *t (the forwards' times and sizes from the
// step events); --max-steps cancels the run early.
diffucoder::Result<diffucoder::Generation> time_generation(const BenchArgs& a, const diffucoder::Model& model,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const diffucoder::GenerationConfig& config,
                                                           GenerationTiming* t) {
  const DeviceBackend* backend = api::device_backend(model);
  auto t_step = Clock::now();
  diffucoder::Hooks hooks;
  hooks.on_step = [&](const diffucoder::StepEvent& s) {
    t->step_ms.push_back(ms_since(t_step));
    if (s.forward) {
      t->forward_ms += s.forward->seconds * 1e3;
      t->forwards += 1, t->positions += s.forward->positions;
      t->flops += forward_flops(model.info(), *s.forward);
      if (t->first_forward_ms < 0) t->first_forward_ms = s.forward->ended_at * 1e3;
    }
    if (t->steps_to_first == 0 && t->first_forward_ms >= 0 && backend != nullptr) {
      t->after_first = backend->counters();
      t->steps_to_first = static_cast<int>(t->step_ms.size());
    }
    t_step = Clock::now();
    if (s.step % 16 == 15 || s.step + 1 == s.n_steps)
      std::fprintf(stderr, "bench: step %d/%d, %.1f ms/step\n", s.step + 1, s.n_steps, t->step_ms.back());
    return a.max_steps <= 0 || s.step + 1 < a.max_steps;
  };
  if (backend != nullptr) t->at_start = backend->counters();
  const auto t_gen = Clock::now();
  t_step = t_gen;
  auto out = model.generate(prompts, config, hooks);
  t->gen_ms = ms_since(t_gen);
  return out;
}

// The device's host-side work per step (runs, recordings, descriptor sets, submissions, uploads), after the
// first step when there are more; an empty object on the CPU.
nlohmann::json device_work_per_step(const DeviceBackend* backend, const GenerationTiming& t) {
  const int steps_run = static_cast<int>(t.step_ms.size());
  if (backend == nullptr || steps_run == 0) return nlohmann::json::object();
  const DeviceCounters after = backend->counters();
  const bool later = t.steps_to_first > 0 && steps_run > t.steps_to_first;
  const DeviceCounters& before = later ? t.after_first : t.at_start;
  const double n = later ? steps_run - t.steps_to_first : steps_run;
  return {{"runs", (after.runs - before.runs) / n}, {"recordings", (after.recordings - before.recordings) / n},
          {"dispatches_recorded", (after.dispatches_recorded - before.dispatches_recorded) / n},
          {"descriptor_sets", (after.descriptor_sets - before.descriptor_sets) / n},
          {"submits", (after.submits - before.submits) / n}, {"uploads", (after.uploads - before.uploads) / n},
          {"upload_bytes", (after.upload_bytes - before.upload_bytes) / n},
          {"downloads", (after.downloads - before.downloads) / n}, {"record_ms", (after.record_ms - before.record_ms) / n},
          {"dispatches_run", (after.dispatches_run - before.dispatches_run) / n},
          {"collect_ms", (after.collect_ms - before.collect_ms) / n}};
}

// --profile: a step's time by what ran, in ms per timed step (the ops' exclusive times, core/profiler.h): the
// layers' GEMMs, attention (with the window's RoPE and KV-cache store), the lm_head, the sampling, and the rest
// of the step's wall time (norms, RoPE, SwiGLU, the embedding, the sampler's own work).
struct StepBreakdown {
  double gemm_ms = 0, attention_ms = 0, lm_head_ms = 0, sampling_ms = 0, rest_ms = 0;
  double gemm_gops = 0;  // the layers' GEMM operations per second of their time
};

StepBreakdown step_breakdown(const Profiler& profiler, const diffucoder::ModelInfo& c, const GenerationTiming& t) {
  StepBreakdown b;
  if (t.step_ms.empty()) return b;
  for (const auto& [path, e] : profiler.entries()) {
    const double ms = e.seconds * 1e3;
    const std::string leaf = path.substr(path.rfind('/') + 1);  // (npos + 1 = 0: the whole path)
    if (path.rfind("lm_head", 0) == 0) {
      b.lm_head_ms += ms;  // with the GEMM nested in it
    } else if (path.rfind("sampling", 0) == 0) {
      b.sampling_ms += ms;
    } else if (leaf.rfind("GEMM", 0) == 0) {
      b.gemm_ms += ms;
    } else if (leaf.find("attention") != std::string::npos || leaf.find("KV cache") != std::string::npos) {
      b.attention_ms += ms;
    }
  }
  double total_ms = 0;
  for (double ms : t.step_ms) total_ms += ms;
  b.gemm_gops = b.gemm_ms > 0 ? layer_gemm_flops(c, static_cast<double>(t.positions)) / (b.gemm_ms * 1e6) : 0.0;
  b.rest_ms = total_ms - b.gemm_ms - b.attention_ms - b.lm_head_ms - b.sampling_ms;
  const double steps = static_cast<double>(t.step_ms.size());
  for (double* ms : {&b.gemm_ms, &b.attention_ms, &b.lm_head_ms, &b.sampling_ms, &b.rest_ms}) *ms /= steps;
  return b;
}

// The CPU's GEMM peaks measured in the run (0: not measured; int8 also 0 without AVX-512 VNNI).
struct Peaks {
  double bf16_gflops = 0, int8_gops = 0;
};

// The numbers of one run, for the JSON and the table.
struct BenchNumbers {
  double load_ms = 0, first_forward_ms = -1, median = 0, p10 = 0, p90 = 0, total_ms = 0, tokens_per_s = 0;
  double forward_ms = 0, gflops = 0, peak = 0;  // the forwards' time, their GFLOP/s; the bf16 GEMM peak (0: not measured)
  double int8_peak = 0;  // the int8 GEMM peak in GOP/s (0: not measured or no VNNI)
  double mean = 0;       // ms per step, the mean of the steps timed
  // Positions computed (GEMM rows, over all batch rows) per step / per forward (with a KV cache: the window's).
  double rows_per_step = 0, rows_per_forward = 0;
  std::optional<StepBreakdown> breakdown;  // --profile
  int steps_run = 0, threads = 0;  // steps timed; the model's CPU threads
  bool complete = false;  // false: stopped by --max-steps, total_ms extrapolated
  nlohmann::json device_work;  // device_work_per_step
  std::string device_name, arithmetic;
  int64_t device_weight_bytes = 0;
};

BenchNumbers bench_numbers(const BenchArgs& a, const diffucoder::Model& model, const GenerationTiming& t, double load_ms,
                           const Peaks& peaks, bool complete) {
  const DeviceBackend* backend = api::device_backend(model);
  BenchNumbers n;
  n.load_ms = load_ms, n.first_forward_ms = t.first_forward_ms, n.peak = peaks.bf16_gflops, n.complete = complete;
  n.int8_peak = peaks.int8_gops;
  n.steps_run = static_cast<int>(t.step_ms.size());
  n.threads = model.info().threads;
  n.median = percentile(t.step_ms, 0.5), n.p10 = percentile(t.step_ms, 0.1), n.p90 = percentile(t.step_ms, 0.9);
  for (double ms : t.step_ms) n.mean += ms / static_cast<double>(t.step_ms.size());
  n.rows_per_step = n.steps_run > 0 ? static_cast<double>(t.positions) / n.steps_run : 0.0;
  n.rows_per_forward = t.forwards > 0 ? static_cast<double>(t.positions) / t.forwards : 0.0;
  // With --max-steps the run stops early: the end-to-end time is extrapolated from the mean step.
  n.total_ms = complete ? t.gen_ms : t.gen_ms / std::max(1, n.steps_run) * a.steps;
  n.tokens_per_s = a.batch * a.new_tokens / (n.total_ms / 1e3);
  n.forward_ms = t.forward_ms;
  n.gflops = t.forward_ms > 0 ? t.flops / (t.forward_ms * 1e6) : 0.0;
  n.device_work = device_work_per_step(backend, t);
  n.device_name = backend != nullptr ? a.device + " (" + model.info().device + ")" : "cpu";
  n.device_weight_bytes = backend != nullptr ? backend->weight_bytes() : 0;
  // A device's GEMMs: exact f32, or its matrix units where --precision bf16 allows them.
  n.arithmetic = backend != nullptr ? backend->arithmetic() : model.info().precision;
  return n;
}

nlohmann::json bench_json(const BenchArgs& a, const diffucoder::ModelInfo& c, const diffucoder::GenerationConfig& p,
                          const BenchNumbers& n, const diffucoder::Result<diffucoder::Generation>& out) {
  nlohmann::json generated = nlohmann::json::array();  // the generated ids per row (complete runs)
  if (n.complete)
    for (int64_t r = 0; r < out->n_rows; ++r) generated.push_back(out->generated(r));
  nlohmann::json j = {
      {"model", a.shape.empty() ? a.model_dir : a.shape}, {"layers", c.n_layer}, {"vocab", c.n_vocab},
      {"threads", n.threads},
      {"prompt_len", a.prompt_len}, {"new_tokens", a.new_tokens}, {"steps", a.steps}, {"batch", a.batch},
      {"alg", a.alg}, {"cache", p.cache}, {"refresh_every", p.refresh_every}, {"block_length", p.block_length},
      {"threshold", p.threshold},
      {"factor", p.factor}, {"weights", a.weights}, {"device", n.device_name},
      {"device_weight_bytes", n.device_weight_bytes},
      {"precision", n.arithmetic}, {"load_ms", n.load_ms}, {"time_to_first_forward_ms", n.load_ms + n.first_forward_ms},
      {"steps_run", n.steps_run}, {"complete", n.complete},
      {"ms_per_step", {{"median", n.median}, {"p10", n.p10}, {"p90", n.p90}, {"mean", n.mean}}},
      {"rows_per_step", n.rows_per_step}, {"rows_per_forward", n.rows_per_forward},
      {"total_ms", n.total_ms}, {"total_extrapolated", !n.complete}, {"tokens_per_second", n.tokens_per_s},
      {"forward_ms", n.forward_ms}, {"achieved_gflops", n.gflops}, {"peak_gemm_gflops", n.peak},
      {"fraction_of_peak", n.peak > 0 ? n.gflops / n.peak : 0.0}, {"peak_int8_gemm_gops", n.int8_peak},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"device_work_per_step", n.device_work},
      // The generated ids per row (complete runs): drift between cache modes is measured from these.
      {"generated", generated}};
  if (n.breakdown) {
    const StepBreakdown& b = *n.breakdown;
    j["step_breakdown_ms"] = {{"layer_gemms", b.gemm_ms}, {"attention", b.attention_ms}, {"lm_head", b.lm_head_ms},
                              {"sampling", b.sampling_ms}, {"rest", b.rest_ms}};
    j["layer_gemm_gops"] = b.gemm_gops;
  }
  return j;
}

void print_bench_table(const BenchArgs& a, const diffucoder::ModelInfo& c, const diffucoder::GenerationConfig& p,
                       const BenchNumbers& n) {
  const bool on_device = n.device_name != "cpu";
  const std::string model = a.shape.empty() ? a.model_dir : a.shape;
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| model | %s (%lld layers, hidden %lld) |\n", model.c_str(), (long long)c.n_layer, (long long)c.hidden_size);
  std::printf("| setting | prompt %lld, new %lld, steps %d, batch %d, alg %s, threads %d |\n", (long long)a.prompt_len,
              (long long)a.new_tokens, a.steps, a.batch, a.alg.c_str(), n.threads);
  std::printf("| decoding | cache %s%s, block %lld, threshold %g, factor %g |\n", p.cache.c_str(),
              p.cache == "committed" ? (" (refresh every " + std::to_string(p.refresh_every) + ")").c_str() : "",
              (long long)p.block_length, p.threshold, p.factor);
  std::printf("| arithmetic | weights %s, matmul precision %s |\n", a.weights.c_str(),
              on_device ? (n.arithmetic + " (device)").c_str() : n.arithmetic.c_str());
  std::printf("| device | %s |\n", n.device_name.c_str());
  if (on_device) std::printf("| device memory | %.1f MiB of weights |\n", n.device_weight_bytes / 1048576.0);
  const nlohmann::json& w = n.device_work;
  if (!w.empty())
    std::printf("| device work per step (after the first forward) | %.1f runs of %.0f dispatches (%.2f ms of host CPU "
                "collecting them), %.1f recordings (%.0f dispatches, %.0f descriptor sets, %.2f ms), %.1f submits, %.1f uploads "
                "(%.0f bytes), %.1f downloads |\n",
                w["runs"].get<double>(), w["dispatches_run"].get<double>(), w["collect_ms"].get<double>(),
                w["recordings"].get<double>(), w["dispatches_recorded"].get<double>(), w["descriptor_sets"].get<double>(),
                w["record_ms"].get<double>(), w["submits"].get<double>(), w["uploads"].get<double>(),
                w["upload_bytes"].get<double>(), w["downloads"].get<double>());
  std::printf("| load | %.0f ms |\n", n.load_ms);
  if (n.first_forward_ms >= 0)
    std::printf("| time to first step | %.0f ms (load + the first forward, %.0f ms) |\n", n.load_ms + n.first_forward_ms,
                n.first_forward_ms);
  std::printf("| ms/step (median / p10 / p90; mean) | %.2f / %.2f / %.2f; %.2f over %d steps |\n", n.median, n.p10, n.p90,
              n.mean, n.steps_run);
  std::printf("| rows per step (per forward) | %.1f (%.1f): positions computed, all batch rows |\n", n.rows_per_step,
              n.rows_per_forward);
  std::printf("| end to end | %.2f s%s |\n", n.total_ms / 1e3, n.complete ? "" : " (extrapolated)");
  std::printf("| tokens/s | %.2f |\n", n.tokens_per_s);
  std::printf("| forward GFLOP/s | %.1f (%.0f%% of the %.1f GFLOP/s bf16 GEMM peak) |\n", n.gflops,
              n.peak > 0 ? 100 * n.gflops / n.peak : 0.0, n.peak);
  if (n.int8_peak > 0) std::printf("| int8 GEMM peak | %.1f GOP/s |\n", n.int8_peak);
  if (n.breakdown) {
    const StepBreakdown& b = *n.breakdown;
    // The integer kernels' yardstick for q8 / q4 weights, the bf16 one for the rest.
    const bool int8 = (a.weights == "q8" || a.weights == "q4") && n.int8_peak > 0;
    const double yardstick = int8 ? n.int8_peak : n.peak;
    std::printf("| ms per step: layers' GEMMs / attention / lm_head / sampling / rest | %.2f / %.2f / %.2f / %.2f / %.2f |\n",
                b.gemm_ms, b.attention_ms, b.lm_head_ms, b.sampling_ms, b.rest_ms);
    std::printf("| layers' GEMMs | %.1f GOP/s (%.0f%% of the %s peak) |\n", b.gemm_gops,
                yardstick > 0 ? 100 * b.gemm_gops / yardstick : 0.0, int8 ? "int8" : "bf16");
  }
  std::printf("| peak RSS | %.2f GB |\n", peak_rss_bytes() / 1e9);
}

int run_bench(const BenchArgs& a) {
  if (Status s = check_bench_flags(a); !s.ok()) return usage_error(s);
  const auto t_load = Clock::now();
  diffucoder::Result<std::unique_ptr<diffucoder::Model>> loaded = load_bench_model(a);
  if (!loaded.ok()) return report(loaded.status());
  const diffucoder::Model& model = **loaded;
  const double load_ms = ms_since(t_load);
  const bool on_device = api::device_backend(model) != nullptr;
  if (!a.model_dir.empty() || on_device) print_load_note(model.info().load_note, load_ms);
  diffucoder::Result<diffucoder::GenerationConfig> config = bench_config(a, model);
  if (!config.ok()) return report(config.status());
  const auto prompts = random_prompts(a, model.info().n_vocab, *config->mask_token_id);

  Peaks peaks;  // the CPU's GEMM peaks: meaningless on a device
  if (!a.no_peak && !on_device) {
    std::fprintf(stderr, "bench: measuring the bf16 and int8 GEMM peaks...\n");
    peaks.bf16_gflops = measure_bf16_gemm_peak_gflops(&api::thread_pool(model));
    peaks.int8_gops = measure_int8_gemm_peak_gops(&api::thread_pool(model));
  }

  GenerationTiming timing;
  Profiler profiler;
  if (a.profile) api::set_profiler(model, &profiler);
  diffucoder::Result<diffucoder::Generation> out = time_generation(a, model, prompts, *config, &timing);
  api::set_profiler(model, nullptr);
  if (!out.ok() && out.status().code() != diffucoder::StatusCode::kCancelled) return report(out.status());
  BenchNumbers n = bench_numbers(a, model, timing, load_ms, peaks, out.ok());
  if (a.profile) n.breakdown = step_breakdown(profiler, model.info(), timing);
  if (a.json) {
    std::printf("%s\n", bench_json(a, model.info(), *config, n, out).dump(2).c_str());
    return 0;
  }
  print_bench_table(a, model.info(), *config, n);
  if (a.profile) print_profile(profiler, n.steps_run, n.mean * n.steps_run / 1e3);
  return 0;
}

}  // namespace

Status check_reshape(const std::string& shape, int64_t layers, int64_t vocab) {
  if ((layers != 0 || vocab != 0) && shape.empty())
    return invalid_argument("--layers and --vocab change a --shape (not a --model checkpoint)");
  if (layers < 0 || layers > 1024 || vocab < 0 || (vocab > 0 && vocab < 16) || vocab > (int64_t{1} << 20))
    return invalid_argument("--layers must be in [0, 1024] and --vocab 0 or in [16, 1048576]");
  return Status();
}

RunFn add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark generation on a checkpoint or a synthetic model");
  cmd->add_option("--model", a->model_dir, "Hugging Face checkpoint directory, or a dream FILE.gguf");
  cmd->add_option("--shape", a->shape, "Synthetic model: diffucoder-7b | qwen2.5-0.5b | tiny (random bf16)");
  cmd->add_option("--layers", a->layers, "--shape: this many layers instead of the shape's (e.g. a 7B-shape layer stack "
                  "that fits in memory); 0 = the shape's");
  cmd->add_option("--vocab", a->vocab, "--shape: this vocabulary size instead of the shape's (its last two ids the mask "
                  "and the pad); 0 = the shape's");
  cmd->add_option("--prompt-len", a->prompt_len, "Prompt tokens (random ids)")->capture_default_str();
  cmd->add_option("--new-tokens", a->new_tokens, "Generated tokens")->capture_default_str();
  CLI::Option* steps = cmd->add_option("--steps", a->steps, "Diffusion steps (--train: timed optimizer steps, default 3)")
                           ->capture_default_str();
  cmd->add_option("--max-steps", a->max_steps, "Stop after N steps and extrapolate (0 = run all)");
  cmd->add_option("--batch", a->batch, "Prompts decoded together")->capture_default_str();
  cmd->add_option("--alg", a->alg, "origin | maskgit_plus | topk_margin | entropy")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0 = all)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--seed", a->seed, "Seed of the weights and prompts")->capture_default_str();
  cmd->add_option("--cache", a->cache, "none | prefix | dual | committed")->capture_default_str();
  cmd->add_option("--refresh-every", a->refresh_every, "--cache committed: the whole block every K-th forward of a block")
      ->capture_default_str()->check(CLI::Range(1, static_cast<int>(kMaxSteps)));
  cmd->add_option("--block-length", a->block_length, "Block decoding (0 = off)")->capture_default_str();
  cmd->add_option("--threshold", a->threshold, "Confidence-threshold parallel decoding (0 = off)");
  cmd->add_option("--factor", a->factor, "Factor-rule parallel decoding (0 = off)");
  cmd->add_option("--weights", a->weights, "Synthetic weights: bf16 | q8 | q4")->capture_default_str();
  cmd->add_option("--group-size", a->group_size, "q4 columns per scale")->capture_default_str();
  cmd->add_flag("--fast", a->fast, "Fast-dLLM mode: block 32, dual cache, threshold 0.9 unless set");
  cmd->add_option("--precision", a->precision, "Matmul activations: auto (the weights' dtype) | f32 | bf16")
      ->capture_default_str();
  cmd->add_option("--weight-cache", a->weight_cache, "--model: packed-weight cache directory, or off");
  cmd->add_option("--lora", a->lora, "--model: a PEFT LoRA adapter directory applied to the model (docs/lora.md)");
  cmd->add_option("--lora-mode", a->lora_mode, "--lora: merged (into the weights at load) | unmerged (added by every "
                  "forward; CPU only)")->capture_default_str();
  cmd->add_option("--device", a->device, "Where the forward runs: cpu | vulkan | vulkan:N")
      ->capture_default_str();
  cmd->add_flag("--no-peak", a->no_peak, "Skip the GEMM peak measurement");
  cmd->add_flag("--json", a->json, "Print JSON");
  auto train = std::make_shared<BenchTrainArgs>();
  add_bench_train_options(cmd, train.get());
  require_finite_floats(cmd);
  return [a, train, steps] {
    if (!train->enabled) {
      a->profile = train->profile;  // (--profile is registered with the --train options)
      return run_bench(*a);
    }
    if (!a->lora.empty()) return usage_error(invalid_argument("--lora: bench --train trains the checkpoint itself, not an adapter"));
    if (a->device != "cpu")  // never timed on the CPU under a device's name
      return usage_error(invalid_argument("--device " + a->device + ": bench --train times the CPU's step only for now "
                                          "(train --device runs the steps on a device; its benchmark is not written yet)"));
    BenchTrainArgs t = *train;
    t.model_dir = a->model_dir, t.shape = a->shape, t.prompt_len = a->prompt_len, t.batch = a->batch;
    t.layers = a->layers, t.vocab = a->vocab;
    t.steps = steps->count() > 0 ? a->steps : t.steps;
    t.threads = a->threads, t.seed = a->seed, t.json = a->json, t.precision = a->precision, t.no_peak = a->no_peak;
    t.weights = a->weights;
    return run_bench_train(t);
  };
}

}  // namespace dc::cli
