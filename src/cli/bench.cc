// `diffucoder bench`: times generation on a checkpoint or on a synthetic model of a named shape and
// prints load time, ms per step (median, p10, p90), tokens/s, peak RSS, achieved GFLOP/s and that as
// a fraction of the bf16 GEMM peak measured in the same run. Progress on stderr. `--train` times
// optimizer steps instead (bench_train.cc).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/clock.h"
#include "engine/engine.h"
#include "model/synthetic.h"
#include "model/quantize.h"
#include "ops/device.h"
#include "ops/peak.h"

namespace dc::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string model_dir, shape;
  int64_t prompt_len = 64, new_tokens = 256;
  int steps = 256, batch = 1, threads = 0, max_steps = 0;
  int64_t layers = 0, vocab = 0;  // --shape: reshape_synthetic's (commands.h)
  std::string alg = "entropy";
  float temperature = 0.0f;
  uint64_t seed = 0;
  bool json = false, no_peak = false, fast = false;
  int64_t block_length = 0;
  std::string cache = "none";
  float threshold = 0.0f, factor = 0.0f;
  std::string weights = "bf16", precision = "auto", weight_cache;
  int64_t group_size = 128;
  std::string device = "cpu";
};

// FLOPs of one forward to the hidden rows: the GEMMs of every layer over the computed positions (the
// window with a KV cache) and their attention over all L keys (not the lm_head: the sampling runs it).
double forward_flops(const ModelConfig& c, const ForwardBatch& b) {
  const double T = static_cast<double>(b.n_computed()), L = static_cast<double>(b.n_seq);
  const double q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim, E = c.n_embd, F = c.n_ff;
  const double per_token = 2.0 * (E * q + 2 * E * kv + q * E + 3 * E * F);
  const double attention = 4.0 * T * L * q;  // q·kᵀ and p·v
  return c.n_layer * (T * per_token + attention);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1) + 0.5)];
}

int run_bench(const BenchArgs& a) {
  if (a.model_dir.empty() == a.shape.empty()) return usage_error(invalid_argument("give exactly one of --model DIR or --shape NAME"));
  if (Status st = check_reshape(a.shape, a.layers, a.vocab); !st.ok()) return usage_error(st);
  if (a.prompt_len < 1 || a.new_tokens < 1 || a.steps < 1 || a.batch < 1)
    return usage_error(invalid_argument("--prompt-len, --new-tokens, --steps and --batch must be >= 1"));
  if (a.prompt_len > kMaxCanvasLength || a.new_tokens > kMaxCanvasLength || a.steps > kMaxSteps ||
      a.batch > kMaxGenerationRows || a.batch * (a.prompt_len + a.new_tokens) > kMaxCanvasLength)
    return usage_error(invalid_argument("--prompt-len and --new-tokens must be <= " + std::to_string(kMaxCanvasLength) +
                                        ", --steps <= " + std::to_string(kMaxSteps) + ", --batch <= " +
                                        std::to_string(kMaxGenerationRows) + ", --batch × (--prompt-len + --new-tokens) <= " +
                                        std::to_string(kMaxCanvasLength)));
  auto precision = parse_matmul_precision(a.precision);
  if (!precision.ok()) return usage_error(precision.status());
  auto device = parse_device(a.device);
  if (!device.ok()) return usage_error(device.status());
  QuantizeOptions quantize;
  quantize.group_size = a.group_size;
  if (a.weights == "q8" || a.weights == "q4") {
    quantize.format = a.weights == "q8" ? WeightQuant::kQ8 : WeightQuant::kQ4;
    if (!a.model_dir.empty())
      return usage_error(invalid_argument("--weights " + a.weights + " applies to --shape models; quantize a checkpoint "
                                     "once with `diffucoder convert --weights " + a.weights + "` and bench that"));
  } else if (a.weights != "bf16") {
    return usage_error(invalid_argument("--weights '" + a.weights + "' is not one of bf16, q8, q4"));
  }
  const auto t_load = Clock::now();
  std::unique_ptr<Engine> engine;
  if (!a.shape.empty()) {
    auto config = synthetic_config(a.shape);
    if (!config.ok()) return report(config.status());
    reshape_synthetic(*config, a.layers, a.vocab);
    std::fprintf(stderr, "bench: building a random %s %s model...\n", a.weights.c_str(), a.shape.c_str());
    ThreadPool fill_pool(a.threads);
    auto model = make_synthetic_model(*config, a.seed, &fill_pool, a.weights == "bf16" ? nullptr : &quantize);
    if (!model.ok()) return report(model.status());
    auto made = Engine::from_model(std::move(*model), a.threads, *device);
    if (!made.ok()) return report(made.status());
    engine = std::move(*made);
    if (Status s = engine->set_matmul_precision(precision->value_or(checkpoint_precision(engine->model()))); !s.ok())
      return report(s);
  } else {
    EngineOptions eo;
    eo.model_dir = a.model_dir;
    eo.n_threads = a.threads;
    eo.matmul_precision = *precision;
    eo.weight_cache = a.weight_cache;
    eo.device = *device;
    auto loaded = Engine::load(eo);
    if (!loaded.ok()) return report(loaded.status());
    engine = std::move(*loaded);
  }
  const double load_ms = ms_since(t_load);
  const std::string precision_name = engine->matmul_precision() == MatmulPrecision::kBF16 ? "bf16" : "f32";
  if (!a.model_dir.empty() || engine->backend() != nullptr) print_load_note(*engine, load_ms);
  const std::string device_name = engine->backend() != nullptr ? a.device + " (" + engine->backend()->name() + ")" : "cpu";
  const ModelConfig& c = engine->config();

  SamplingParams p = engine->default_params();
  auto alg = parse_algorithm(a.alg);
  if (!alg.ok()) return usage_error(alg.status());
  p.alg = *alg;
  p.steps = a.steps;
  p.max_new_tokens = a.new_tokens;
  p.temperature = a.temperature;
  p.seed = a.seed;
  p.block_length = a.block_length;
  auto cache = parse_cache_mode(a.cache);
  if (!cache.ok()) return usage_error(cache.status());
  p.cache = *cache;
  p.threshold = a.threshold;
  p.factor = a.factor;
  if (a.fast) apply_fast_mode(p);
  if (Status s = validate(p, c.n_vocab); !s.ok()) return report(s);
  const char* cache_name = cache_mode_name(p.cache);

  std::mt19937 gen(static_cast<uint32_t>(a.seed));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(std::min<int64_t>(c.n_vocab, 150000) - 1));
  std::vector<std::vector<int32_t>> prompts(a.batch, std::vector<int32_t>(a.prompt_len));
  for (auto& prompt : prompts)
    for (auto& t : prompt) {
      do t = id(gen); while (t == p.mask_token_id);
    }

  const bool cpu_peak = !a.no_peak && engine->backend() == nullptr;  // the CPU's GEMM peak: meaningless on a device
  if (cpu_peak) std::fprintf(stderr, "bench: measuring the bf16 GEMM peak...\n");
  const double peak = cpu_peak ? measure_bf16_gemm_peak_gflops(&engine->pool()) : 0.0;

  // Time each step (from on_step to on_step) and each forward with its FLOPs.
  std::vector<double> step_ms;
  double flops = 0, forward_ms = 0;
  double first_forward_ms = -1;  // from the start of generation to the end of its first forward
  auto t_step = Clock::now();
  auto t_gen = t_step;
  // The device's counters at the start and after the first step that ran a forward (which compiles the
  // pipelines and records the first command buffers; a step may commit without one): the work per step is the
  // later steps' when there are any.
  DeviceCounters at_start, after_first;
  int steps_to_first = 0;  // steps up to and including the first with a forward (0: none yet)
  GenerateHooks hooks;
  hooks.on_step = [&](const StepInfo& s) {
    step_ms.push_back(ms_since(t_step));
    if (steps_to_first == 0 && first_forward_ms >= 0 && engine->backend() != nullptr) {
      after_first = engine->backend()->counters();
      steps_to_first = static_cast<int>(step_ms.size());
    }
    t_step = Clock::now();
    if (s.step % 16 == 15 || s.step + 1 == s.n_steps)
      std::fprintf(stderr, "bench: step %d/%d, %.1f ms/step\n", s.step + 1, s.n_steps, step_ms.back());
    return a.max_steps <= 0 || s.step + 1 < a.max_steps;
  };
  const HeadFn inner = engine->head_fn();
  const HeadFn timed = [&](const ForwardBatch& b) {
    const auto t = Clock::now();
    Result<HeadSampler*> head = inner(b);
    forward_ms += ms_since(t);
    if (first_forward_ms < 0) first_forward_ms = ms_since(t_gen);
    flops += forward_flops(c, b);
    return head;
  };
  hooks.pool = &engine->pool();
  if (engine->backend() != nullptr) at_start = engine->backend()->counters();
  t_gen = Clock::now();
  t_step = t_gen;
  auto out = generate(timed, c.n_vocab, prompts, p, hooks);
  const double gen_ms = ms_since(t_gen);
  if (!out.ok() && !is_cancelled(out.status())) return report(out.status());
  const bool complete = out.ok();
  const int steps_run = static_cast<int>(step_ms.size());
  const double median = percentile(step_ms, 0.5);
  // With --max-steps the run stops early: the end-to-end time is extrapolated from the mean step.
  const double total_ms = complete ? gen_ms : gen_ms / std::max(1, steps_run) * a.steps;
  const double tokens_per_s = a.batch * a.new_tokens / (total_ms / 1e3);
  const double gflops = forward_ms > 0 ? flops / (forward_ms * 1e6) : 0.0;
  // The device's host-side work per step (runs, recordings, descriptor sets, submissions, uploads), after the
  // first step when there are more.
  nlohmann::json device_work = nlohmann::json::object();
  if (engine->backend() != nullptr && steps_run > 0) {
    const DeviceCounters after = engine->backend()->counters();
    const bool later = steps_to_first > 0 && steps_run > steps_to_first;
    const DeviceCounters& before = later ? after_first : at_start;
    const double n = later ? steps_run - steps_to_first : steps_run;
    device_work = {{"runs", (after.runs - before.runs) / n}, {"recordings", (after.recordings - before.recordings) / n},
                   {"dispatches_recorded", (after.dispatches_recorded - before.dispatches_recorded) / n},
                   {"descriptor_sets", (after.descriptor_sets - before.descriptor_sets) / n},
                   {"submits", (after.submits - before.submits) / n}, {"uploads", (after.uploads - before.uploads) / n},
                   {"upload_bytes", (after.upload_bytes - before.upload_bytes) / n},
                   {"downloads", (after.downloads - before.downloads) / n}, {"record_ms", (after.record_ms - before.record_ms) / n},
                   {"dispatches_run", (after.dispatches_run - before.dispatches_run) / n},
                   {"collect_ms", (after.collect_ms - before.collect_ms) / n}};
  }

  // A device's GEMMs: exact f32, or its matrix units where --precision bf16 allows them.
  const std::string arithmetic = engine->backend() != nullptr ? engine->backend()->arithmetic() : precision_name;
  nlohmann::json j = {
      {"model", a.shape.empty() ? a.model_dir : a.shape}, {"layers", c.n_layer}, {"vocab", c.n_vocab},
      {"threads", engine->pool().n_threads()},
      {"prompt_len", a.prompt_len}, {"new_tokens", a.new_tokens}, {"steps", a.steps}, {"batch", a.batch},
      {"alg", a.alg}, {"cache", cache_name}, {"block_length", p.block_length}, {"threshold", p.threshold},
      {"factor", p.factor}, {"weights", a.weights}, {"device", device_name},
      {"device_weight_bytes", engine->backend() != nullptr ? engine->backend()->weight_bytes() : 0}, {"precision", arithmetic}, {"load_ms", load_ms}, {"time_to_first_forward_ms", load_ms + first_forward_ms}, {"steps_run", steps_run}, {"complete", complete},
      {"ms_per_step", {{"median", median}, {"p10", percentile(step_ms, 0.1)}, {"p90", percentile(step_ms, 0.9)}}},
      {"total_ms", total_ms}, {"total_extrapolated", !complete}, {"tokens_per_second", tokens_per_s},
      {"forward_ms", forward_ms}, {"achieved_gflops", gflops}, {"peak_gemm_gflops", peak},
      {"fraction_of_peak", peak > 0 ? gflops / peak : 0.0}, {"peak_rss_bytes", peak_rss_bytes()},
      {"device_work_per_step", device_work},
      // The generated ids per row (complete runs): drift between cache modes is measured from these.
      {"generated", complete ? nlohmann::json(out->generated) : nlohmann::json::array()}};
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| model | %s (%lld layers, hidden %lld) |\n", j["model"].get<std::string>().c_str(), (long long)c.n_layer,
              (long long)c.n_embd);
  std::printf("| setting | prompt %lld, new %lld, steps %d, batch %d, alg %s, threads %d |\n", (long long)a.prompt_len,
              (long long)a.new_tokens, a.steps, a.batch, a.alg.c_str(), engine->pool().n_threads());
  std::printf("| decoding | cache %s, block %lld, threshold %g, factor %g |\n", cache_name,
              (long long)p.block_length, p.threshold, p.factor);
  std::printf("| arithmetic | weights %s, matmul precision %s |\n", a.weights.c_str(),
              engine->backend() != nullptr ? (arithmetic + " (device)").c_str() : arithmetic.c_str());
  std::printf("| device | %s |\n", device_name.c_str());
  if (engine->backend() != nullptr)
    std::printf("| device memory | %.1f MiB of weights |\n", engine->backend()->weight_bytes() / 1048576.0);
  if (!device_work.empty())
    std::printf("| device work per step (after the first forward) | %.1f runs of %.0f dispatches (%.2f ms of host CPU "
                "collecting them), %.1f recordings (%.0f dispatches, %.0f descriptor sets, %.2f ms), %.1f submits, %.1f uploads "
                "(%.0f bytes), %.1f downloads |\n",
                device_work["runs"].get<double>(), device_work["dispatches_run"].get<double>(),
                device_work["collect_ms"].get<double>(), device_work["recordings"].get<double>(),
                device_work["dispatches_recorded"].get<double>(), device_work["descriptor_sets"].get<double>(),
                device_work["record_ms"].get<double>(), device_work["submits"].get<double>(), device_work["uploads"].get<double>(),
                device_work["upload_bytes"].get<double>(), device_work["downloads"].get<double>());
  std::printf("| load | %.0f ms |\n", load_ms);
  if (first_forward_ms >= 0)
    std::printf("| time to first step | %.0f ms (load + the first forward, %.0f ms) |\n", load_ms + first_forward_ms,
                first_forward_ms);
  std::printf("| ms/step (median / p10 / p90) | %.2f / %.2f / %.2f over %d steps |\n", median,
              percentile(step_ms, 0.1), percentile(step_ms, 0.9), steps_run);
  std::printf("| end to end | %.2f s%s |\n", total_ms / 1e3, complete ? "" : " (extrapolated)");
  std::printf("| tokens/s | %.2f |\n", tokens_per_s);
  std::printf("| forward GFLOP/s | %.1f (%.0f%% of the %.1f GFLOP/s bf16 GEMM peak) |\n", gflops,
              peak > 0 ? 100 * gflops / peak : 0.0, peak);
  std::printf("| peak RSS | %.2f GB |\n", peak_rss_bytes() / 1e9);
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

void reshape_synthetic(ModelConfig& config, int64_t layers, int64_t vocab) {
  if (layers > 0) config.n_layer = layers;
  if (vocab > 0) {
    config.n_vocab = vocab, config.mask_token_id = vocab - 2;
    config.pad_token_id = config.eos_token_id = config.bos_token_id = vocab - 1;
  }
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
  cmd->add_option("--cache", a->cache, "none | prefix | dual")->capture_default_str();
  cmd->add_option("--block-length", a->block_length, "Block decoding (0 = off)")->capture_default_str();
  cmd->add_option("--threshold", a->threshold, "Confidence-threshold parallel decoding (0 = off)");
  cmd->add_option("--factor", a->factor, "Factor-rule parallel decoding (0 = off)");
  cmd->add_option("--weights", a->weights, "Synthetic weights: bf16 | q8 | q4")->capture_default_str();
  cmd->add_option("--group-size", a->group_size, "q4 columns per scale")->capture_default_str();
  cmd->add_flag("--fast", a->fast, "Fast-dLLM mode: block 32, dual cache, threshold 0.9 unless set");
  cmd->add_option("--precision", a->precision, "Matmul activations: auto (the weights' dtype) | f32 | bf16")
      ->capture_default_str();
  cmd->add_option("--weight-cache", a->weight_cache, "--model: packed-weight cache directory, or off");
  cmd->add_option("--device", a->device, "Where the forward runs: cpu | vulkan | vulkan:N")
      ->capture_default_str();
  cmd->add_flag("--no-peak", a->no_peak, "Skip the GEMM peak measurement");
  cmd->add_flag("--json", a->json, "Print JSON");
  auto train = std::make_shared<BenchTrainArgs>();
  add_bench_train_options(cmd, train.get());
  require_finite_floats(cmd);
  return [a, train, steps] {
    if (!train->enabled) return run_bench(*a);
    BenchTrainArgs t = *train;
    t.model_dir = a->model_dir, t.shape = a->shape, t.prompt_len = a->prompt_len, t.batch = a->batch;
    t.layers = a->layers, t.vocab = a->vocab;
    t.steps = steps->count() > 0 ? a->steps : t.steps;
    t.threads = a->threads, t.seed = a->seed, t.json = a->json, t.precision = a->precision, t.no_peak = a->no_peak;
    return run_bench_train(t);
  };
}

}  // namespace dc::cli
