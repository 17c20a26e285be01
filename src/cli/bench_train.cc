// `diffucoder bench --train`: times Trainer::step (make_masked_batch → loss_and_grads → clip_grad_norm →
// adamw_step) on random sequences, on a synthetic model of a named shape or a checkpoint, in bf16 mixed
// precision (the training default) or f32, with a trainer that writes no files. Prints s/step, training
// tokens/s, forward and backward GFLOP/s, peak RSS; under mpirun, data parallel (ZeRO), with each rank's
// peak RSS, optimizer-state bytes and bytes sent.
#include <CLI/CLI.hpp>
#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "api/measure.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "ops/peak.h"

namespace dc::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// FLOPs of one training step (forward + backward = 3 forwards): 6 per matmul parameter per token for
// the layer projections over all T = B·L positions, 6·E·V per lm_head row actually computed (n_out,
// the masked positions), and 12·L·L·(H·D) per sequence per layer for attention (q·kᵀ and p·v: 4·L²·H·D
// forward, twice that backward). Embedding gathers, norms and element-wise ops are not counted.
// A frozen base (LoRA) skips the dW products: 4 per matmul parameter per token (the adapters' own products,
// 2·r·(in + out) per projection and token, are not counted).
double train_step_flops(const diffucoder::ModelInfo& c, int64_t n_batch, int64_t n_seq, int64_t n_out, bool frozen_base) {
  const double q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim, E = c.hidden_size, F = c.intermediate_size;
  const double layer_params = E * q + 2 * E * kv + q * E + 3 * E * F, per_param = frozen_base ? 4.0 : 6.0;
  const double T = static_cast<double>(n_batch * n_seq), L = static_cast<double>(n_seq);
  return c.n_layer * (per_param * layer_params * T + 12.0 * n_batch * L * L * q) + per_param * E * c.n_vocab * n_out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct StepRecord {
  double seconds = 0, masking_s = 0, fwd_bwd_s = 0, optimizer_s = 0, relayout_s = 0, forward_s = 0, backward_s = 0;
  double loss = 0, grad_norm = 0;
  int64_t n_out = 0;  // loss rows (masked positions) of the batch
};

Status check_args(const BenchTrainArgs& a) {
  if (a.model_dir.empty() == a.shape.empty()) return invalid_argument("give exactly one of --model DIR or --shape NAME");
  if (a.seq_len < 2) return invalid_argument("--seq-len must be at least 2 (got " + std::to_string(a.seq_len) + ")");
  if (a.prompt_len < 1 || a.prompt_len >= a.seq_len)
    return invalid_argument("--prompt-len must be in [1, --seq-len) for --train (got " + std::to_string(a.prompt_len) +
                            " with --seq-len " + std::to_string(a.seq_len) + ")");
  if (a.batch < 1 || a.steps < 1) return invalid_argument("--batch and --steps must be >= 1");
  if (a.seq_len > (int64_t{1} << 20) || a.batch > 4096 || a.steps > (1 << 20) || a.batch * a.seq_len > (int64_t{1} << 24))
    return invalid_argument("--seq-len must be <= 1048576, --batch <= 4096, --batch × --seq-len <= 16777216 and "
                            "--steps <= 1048576");
  if (!(a.mask_ratio == 0.0 || (a.mask_ratio > 0.0 && a.mask_ratio <= 1.0)))
    return invalid_argument("--mask-ratio must be in (0, 1], or 0 to draw t ~ U(eps, 1) per sequence");
  if (!(a.lr >= 0.0)) return invalid_argument("--lr must be >= 0");
  if (a.weights != "bf16" && a.lora_r == 0)
    return invalid_argument("--weights " + a.weights + " with --train: quantized weights train only as a frozen LoRA base "
                            "(add --lora-r R)");
  DC_RETURN_IF_ERROR(check_reshape(a.shape, a.layers, a.vocab));
  if (a.lora_r > 0) DC_RETURN_IF_ERROR(parse_lora_targets(a.lora_targets).status());
  return Status();
}

}  // namespace

// (--train: forward, backward, loss, the optimizer's passes, the gradient norm, masking; what no scope covers —
// the loss's logits buffer, the metrics line — is the rest.)
void print_profile(const Profiler& profiler, int steps, double step_total) {
  std::vector<std::pair<std::string, Profiler::Entry>> rows(profiler.entries().begin(), profiler.entries().end());
  std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.second.seconds > y.second.seconds; });
  std::printf("\n| phase (exclusive of the phases nested in it) | ms/step | calls/step | %% of the step |\n|---|---|---|---|\n");
  double covered = 0;
  for (const auto& [path, e] : rows) {
    covered += e.seconds;
    std::printf("| %s | %.1f | %.0f | %.1f |\n", path.c_str(), 1e3 * e.seconds / steps, double(e.calls) / steps,
                step_total > 0 ? 100 * e.seconds / step_total : 0.0);
  }
  std::printf("| (the rest of the step) | %.1f | | %.1f |\n", 1e3 * (step_total - covered) / steps,
              step_total > 0 ? 100 * (step_total - covered) / step_total : 0.0);
}

void add_bench_train_options(CLI::App* cmd, BenchTrainArgs* a) {
  cmd->add_flag("--train", a->enabled,
                "Time masked-diffusion optimizer steps (AdamW; --precision bf16 mixed by default, or f32) instead of generation; uses --model/--shape, "
                "--prompt-len (never-masked prefix), --batch, --steps, --threads, --seed, --json");
  cmd->add_option("--seq-len", a->seq_len, "--train: tokens per sequence")->capture_default_str();
  cmd->add_option("--mask-ratio", a->mask_ratio,
                  "--train: mask ratio t of every sequence (fixed so each step does the same work); "
                  "0 = draw t ~ U(eps, 1) as training does")
      ->capture_default_str();
  cmd->add_option("--lr", a->lr, "--train: AdamW learning rate (constant; weight decay 0.1 on matrices)")
      ->capture_default_str();
  cmd->add_flag("--grad-checkpointing", a->grad_checkpointing,
                "--train: keep only each layer's input and recompute the layer in the backward");
  cmd->add_option("--lora-r", a->lora_r, "--train: LoRA adapters of this rank (alpha = r) over the frozen base "
                  "(--shape: bench's --weights bf16 | q8 | q4)")
      ->capture_default_str()->check(CLI::Range(0, 65536));
  cmd->add_option("--lora-targets", a->lora_targets, "--train --lora-r: all-linear, or a comma list of q_proj,...,down_proj")
      ->capture_default_str();
  cmd->add_flag("--profile", a->profile,
                "Time every op and print the per-phase table (cheap timers, off by default); generation: also a "
                "step's time split into the layers' GEMMs, attention, the lm_head, the sampling and the rest; --train: "
                "of the timed steps (forward, backward, loss, optimizer)");
}

namespace {

// What a bench --train run measured, for its report (summary_json, print_summary).
struct BenchRun {
  const BenchTrainArgs* a = nullptr;
  diffucoder::ModelInfo info;  // the trained model's dimensions, its threads
  diffucoder::TrainConfig config;
  int ranks = 1;
  bool mixed = true;
  double peak = 0, load_s = 0;
  int64_t n_params = 0, rss = 0, trainable = 0;
  std::vector<StepRecord> records;  // [0]: the warm-up
  RankNumbers numbers;
};

// The trainer's config: a constant rate, weight decay 0.1 on matrices, clipping at 1, no output files, random
// sequences (ids below min(n_vocab, 150000) except the mask id; the first prompt_len of each the prompt, never
// masked), one batch per step and rank; under mpirun each rank one micro-batch of every step (grad_accum = ranks).
diffucoder::TrainConfig bench_train_config(const BenchTrainArgs& a, bool mixed, int n_total, diffucoder::Ranks& ranks) {
  diffucoder::TrainConfig c;
  if (a.shape.empty()) c.model_dir = a.model_dir;
  else c.synthetic = diffucoder::SyntheticModel{a.shape, a.layers, a.vocab, a.lora_r > 0 ? a.weights : "bf16", 128, a.seed};
  c.seq_len = a.seq_len;
  c.batch_size = a.batch;
  c.steps = n_total;
  c.lr_schedule = "constant";
  c.lr = a.lr;
  c.weight_decay = 0.1;
  c.max_grad_norm = 1.0;
  c.seed = a.seed;
  c.mask_ratio = a.mask_ratio;
  c.grad_checkpointing = a.grad_checkpointing;
  c.precision = mixed ? "bf16" : "f32";
  c.grad_accum = ranks.size();
  c.ranks = &ranks;
  c.lora_r = a.lora_r;
  c.lora_targets = a.lora_targets;
  c.threads = a.threads;
  c.random_sequences = int64_t{n_total} * a.batch * ranks.size();
  c.random_prompt_len = a.prompt_len;
  return c;
}

// Runs the warm-up and the timed steps (rank 0 prints each); the profiler restarts after the warm-up.
diffucoder::Result<std::vector<StepRecord>> run_steps(diffucoder::Trainer& trainer, int n_total, int timed, bool talk,
                                                      Profiler& profiler) {
  std::vector<StepRecord> records;
  for (int step = 0; step < n_total; ++step) {
    diffucoder::Result<diffucoder::TrainStepStats> stats = trainer.step();  // masking, loss_and_grads, the optimizer
    if (!stats.ok()) return stats.status();
    StepRecord r;
    r.seconds = stats->seconds;
    r.fwd_bwd_s = stats->forward_backward_seconds;
    r.optimizer_s = stats->optimizer_seconds;
    r.relayout_s = stats->relayout_seconds;
    r.forward_s = stats->forward_seconds;
    r.backward_s = stats->backward_seconds;
    r.masking_s = stats->masking_seconds;
    r.loss = stats->loss;
    r.grad_norm = stats->grad_norm;
    r.n_out = stats->loss_rows;
    records.push_back(r);
    if (step == 0) profiler.reset();  // the table covers the timed steps only
    if (talk)
      std::fprintf(stderr, "bench --train: %s %d/%d  %.2f s (fwd+bwd %.2f, optimizer %.2f)  loss %.4f  |g| %.3e\n",
                   step == 0 ? "warm-up" : "step", step == 0 ? 0 : step, timed, r.seconds, r.fwd_bwd_s,
                   r.optimizer_s, r.loss, r.grad_norm);
  }
  return records;
}

// The --json object: the settings, the medians over the timed steps, every step, each rank's numbers.
nlohmann::json summary_json(const BenchRun& b, const Profiler& profiler) {
  const BenchTrainArgs& a = *b.a;
  const diffucoder::ModelInfo& c = b.info;
  const std::vector<StepRecord> timed(b.records.begin() + 1, b.records.end());
  std::vector<double> secs, fwd_bwd, opt, gflops, fwd_gflops, bwd_gflops, relayout;
  nlohmann::json losses = nlohmann::json::array(), steps_json = nlohmann::json::array();
  for (const StepRecord& r : timed) {
    secs.push_back(r.seconds), fwd_bwd.push_back(r.fwd_bwd_s), opt.push_back(r.optimizer_s);
    // one rank's; forward 1/3, backward 2/3 (a frozen base: 1/2 and 1/2)
    const bool frozen = a.lora_r > 0;
    const double flops = train_step_flops(c, a.batch, a.seq_len, r.n_out / b.ranks, frozen), fwd_part = frozen ? 0.5 : 1.0 / 3;
    gflops.push_back(flops / r.fwd_bwd_s / 1e9);
    fwd_gflops.push_back(flops * fwd_part / r.forward_s / 1e9);
    bwd_gflops.push_back(flops * (1 - fwd_part) / r.backward_s / 1e9);
    relayout.push_back(r.relayout_s);
    losses.push_back(r.loss);
    steps_json.push_back({{"seconds", r.seconds}, {"masking_s", r.masking_s}, {"fwd_bwd_s", r.fwd_bwd_s},
                          {"optimizer_s", r.optimizer_s}, {"loss", r.loss}, {"grad_norm", r.grad_norm},
                          {"n_loss_rows", r.n_out}});
  }
  const double tokens = static_cast<double>(a.batch * a.seq_len * b.ranks);  // the global batch's
  const double med = median(secs), best = *std::min_element(secs.begin(), secs.end());
  nlohmann::json rss_ranks = nlohmann::json::array(), state_ranks = nlohmann::json::array(),
                 sent_ranks = nlohmann::json::array(), grad_ranks = nlohmann::json::array(),
                 master_ranks = nlohmann::json::array();
  for (const RankNumbers::Rank& r : b.numbers.ranks)
    rss_ranks.push_back(r.peak_rss_bytes), master_ranks.push_back(r.master_weight_bytes),
        state_ranks.push_back(r.optimizer_state_bytes),
        sent_ranks.push_back(r.bytes_sent_per_step), grad_ranks.push_back(r.gradient_bytes);
  nlohmann::json j = {
      {"mode", "train"}, {"precision", b.mixed ? "bf16 mixed" : "f32"},
      {"model", a.shape.empty() ? a.model_dir : a.shape}, {"threads", b.info.threads},
      {"seq_len", a.seq_len}, {"prompt_len", a.prompt_len}, {"batch", a.batch}, {"steps", a.steps},
      {"mask_ratio", a.mask_ratio}, {"lr", a.lr}, {"weight_decay", b.config.weight_decay},
      {"max_grad_norm", b.config.max_grad_norm}, {"grad_checkpointing", a.grad_checkpointing},
      {"n_params", b.n_params}, {"load_s", b.load_s}, {"lora_r", a.lora_r}, {"lora_targets", a.lora_targets},
      {"base_weights", a.lora_r > 0 ? a.weights : "f32 masters"}, {"trainable_values", b.trainable},
      {"seconds_per_step", {{"median", med}, {"min", best}}}, {"fwd_bwd_s_median", median(fwd_bwd)},
      {"optimizer_s_median", median(opt)}, {"tokens_per_second", tokens / med},
      {"tokens_per_second_best", tokens / best}, {"fwd_bwd_gflops_median", median(gflops)},
      {"forward_gflops_median", median(fwd_gflops)}, {"backward_gflops_median", median(bwd_gflops)},
      {"relayout_s_median", median(relayout)}, {"peak_gemm_gflops", b.peak},
      {"fraction_of_peak", b.peak > 0 ? median(gflops) / b.peak : 0.0}, {"layers", c.n_layer}, {"vocab", c.n_vocab},
      {"warmup", {{"seconds", b.records[0].seconds}, {"loss", b.records[0].loss}}}, {"losses", losses},
      {"per_step", steps_json}, {"peak_rss_bytes", b.rss}, {"ranks", b.ranks}, {"peak_rss_bytes_per_rank", rss_ranks},
      {"master_weight_bytes_per_rank", master_ranks}, {"optimizer_state_bytes_per_rank", state_ranks},
      {"gradient_bytes_per_rank", grad_ranks},
      {"bytes_sent_per_step_per_rank", sent_ranks}};
  if (a.profile) {
    nlohmann::json& profile = j["profile"];  // path → seconds and calls per timed step (exclusive times)
    for (const auto& [path, e] : profiler.entries())
      profile[path] = {{"seconds_per_step", e.seconds / a.steps}, {"calls_per_step", double(e.calls) / a.steps}};
  }
  return j;
}

// The markdown table (and --profile's) of summary_json's numbers `j`.
void print_summary(const BenchRun& b, const nlohmann::json& j, const Profiler& profiler) {
  const BenchTrainArgs& a = *b.a;
  const diffucoder::ModelInfo& c = b.info;
  const double med = j["seconds_per_step"]["median"], best = j["seconds_per_step"]["min"];
  const double tokens = static_cast<double>(a.batch * a.seq_len * b.ranks), gflops = j["fwd_bwd_gflops_median"];
  std::string loss_text;
  double step_total = 0;
  for (size_t i = 1; i < b.records.size(); ++i) {
    loss_text += (loss_text.empty() ? "" : ", ") + std::to_string(b.records[i].loss).substr(0, 7);
    step_total += b.records[i].seconds;
  }
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| model | %s%s (%lld layers, hidden %lld, vocabulary %lld, %.1fM parameters, %s) |\n",
              j["model"].get<std::string>().c_str(), a.layers > 0 || a.vocab > 0 ? " reduced by --layers / --vocab" : "",
              (long long)c.n_layer, (long long)c.hidden_size, (long long)c.n_vocab, b.n_params / 1e6,
              a.lora_r > 0 ? ("frozen " + a.weights + " base, LoRA r=" + std::to_string(a.lora_r) + " on " + a.lora_targets +
                              ": " + std::to_string(b.trainable) + " trainable values").c_str()
                           : "f32 master weights");
  std::printf("| precision | %s |\n", b.mixed ? (a.lora_r > 0 ? "bf16 GEMM operands, f32 sums (adapters and moments f32)"
                                                          : "bf16 mixed (bf16 GEMM operands, f32 sums)")
                                             : "f32");
  std::printf("| setting | seq %lld (prompt %lld), batch %d, mask ratio %s, %d timed steps + 1 warm-up, threads %d |\n",
              (long long)a.seq_len, (long long)a.prompt_len, a.batch,
              a.mask_ratio > 0 ? std::to_string(a.mask_ratio).substr(0, 4).c_str() : "U(eps,1)", a.steps, b.info.threads);
  std::printf("| optimizer | AdamW lr %g, weight decay %g (matrices), clip %g%s |\n", a.lr, b.config.weight_decay,
              b.config.max_grad_norm, a.grad_checkpointing ? "; gradient checkpointing" : "");
  std::printf("| load | %.1f s |\n", b.load_s);
  std::printf("| s/step (median / min) | %.3f / %.3f |\n", med, best);
  std::printf("| fwd+bwd / optimizer (median) | %.3f / %.3f s |\n", j["fwd_bwd_s_median"].get<double>(),
              j["optimizer_s_median"].get<double>());
  std::printf("| training tokens/s | %.1f (best %.1f) |\n", tokens / med, tokens / best);
  std::printf("| fwd+bwd GFLOP/s | %.1f (forward %.1f, backward %.1f); %.0f%% of the %.1f GFLOP/s bf16 GEMM peak |\n",
              gflops, j["forward_gflops_median"].get<double>(), j["backward_gflops_median"].get<double>(),
              b.peak > 0 ? 100 * gflops / b.peak : 0.0, b.peak);
  if (b.mixed && a.lora_r == 0)  // (a frozen base is re-laid once, at the first step)
    std::printf("| bf16 re-layout of the weights per step | %.3f s outside the optimizer (%s) |\n",
                j["relayout_s_median"].get<double>(),
                b.ranks > 1 ? "every step: the weights come from the all-gather"
                            : "after the first step it is written by AdamW, in its time");
  std::printf("| peak RSS | %.2f GB |\n", b.rss / 1e9);
  if (b.ranks > 1)
    for (int r = 0; r < b.ranks; ++r) {
      const RankNumbers::Rank& n = b.numbers.ranks[static_cast<size_t>(r)];
      std::printf("| rank %d of %d | peak RSS %.2f GB, f32 master weights %.2f GB, Adam moments %.2f GB, gradients "
                  "%.2f GB, %.3f GB sent per step |\n", r, b.ranks, n.peak_rss_bytes / 1e9, n.master_weight_bytes / 1e9,
                  n.optimizer_state_bytes / 1e9, n.gradient_bytes / 1e9, n.bytes_sent_per_step / 1e9);
    }
  std::printf("| loss per step | %s (warm-up %.4f) |\n", loss_text.c_str(), b.records[0].loss);
  if (a.profile) print_profile(profiler, a.steps, step_total);
}

}  // namespace

// Under mpirun: data parallel, each rank one micro-batch of --batch sequences of every step (the
// trainer's grad_accum = ranks); rank 0 prints, with every rank's peak RSS, moment bytes and bytes
// sent per step.
int bench_train_on_ranks(const BenchTrainArgs& a, diffucoder::Ranks& ranks) {
  if (Status s = check_args(a); !s.ok()) return usage_error(s);
  BenchRun b;
  b.a = &a, b.ranks = ranks.size();
  const bool talk = ranks.rank() == 0;
  Profiler profiler;
  auto precision = parse_matmul_precision(a.precision);
  if (!precision.ok()) return report(precision.status());
  b.mixed = precision->value_or(MatmulPrecision::kBF16) == MatmulPrecision::kBF16;
  if (!a.no_peak) {
    if (talk) std::fprintf(stderr, "bench --train: measuring the bf16 GEMM peak...\n");
    ThreadPool pool(a.threads);
    b.peak = measure_bf16_gemm_peak_gflops(&pool);
  }
  const auto t_load = Clock::now();
  const int n_total = a.steps + 1;  // step 0 is the warm-up
  b.config = bench_train_config(a, b.mixed, n_total, ranks);
  if (!a.shape.empty())
    std::fprintf(stderr, "bench --train: building random %s weights of the %s shape...\n",
                 a.lora_r > 0 ? a.weights.c_str() : "f32", a.shape.c_str());
  auto trainer = api::create_trainer(b.config, a.profile ? &profiler : nullptr);
  if (!trainer.ok()) return report(trainer.status());
  if (b.mixed && (*trainer)->precision() != "bf16")
    return report(unimplemented("bench --train --precision bf16 needs AVX512_BF16; use --precision f32"));
  b.info = (*trainer)->info();
  b.n_params = (*trainer)->parameters();
  b.trainable = (*trainer)->trainable_values();
  b.load_s = seconds_since(t_load);
  auto records = run_steps(**trainer, n_total, a.steps, talk, profiler);
  if (!records.ok()) return report(records.status());
  b.records = std::move(*records);
  b.rss = peak_rss_bytes();
  auto stats = (*trainer)->gather_rank_stats();
  if (!stats.ok()) return report(stats.status());
  b.numbers = report_rank_numbers(ranks.rank(), *stats, /*quiet=*/true);
  if (!talk) return 0;
  const nlohmann::json j = summary_json(b, profiler);
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  print_summary(b, j, profiler);
  return 0;
}

int run_bench_train(const BenchTrainArgs& a) {
  return run_on_ranks(600, [&a](diffucoder::Ranks& ranks) { return bench_train_on_ranks(a, ranks); });
}

}  // namespace dc::cli
