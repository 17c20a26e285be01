// `diffucoder train --model DIR --data FILE --out DIR [...]`: masked-diffusion fine-tuning on CPU, built on
// the public API (diffucoder::Trainer over src/train/); a progress line per step on stderr, metrics.jsonl,
// loss.svg and checkpoints in --out. Under `mpirun -np N` (MPI built in, diffucoder::Ranks): data parallel
// with ZeRO-sharded optimizer state; rank 0 shows the progress and prints the result, every rank's peak
// memory gathered.
#include <CLI/CLI.hpp>

#include <diffucoder/diffucoder.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranks_agree.h"

namespace dc::cli {
namespace {

struct TrainArgs {
  diffucoder::TrainConfig config;
  std::string precision = "bf16";  // also "auto" (= bf16), as the other commands' --precision
  bool quiet = false;
  int64_t exit_after = 0;  // tests: _exit(137) right after this step, as a kill would
  int exit_rank = -1;      // tests: only this rank exits (-1: every rank)
  double dist_timeout = 600;
};

int run_train(TrainArgs& a, diffucoder::Ranks& ranks) {
  diffucoder::TrainConfig& c = a.config;
  if (c.batch_size * c.seq_len > (int64_t{1} << 24))
    return usage_error(invalid_argument("--batch-size × --seq-len must be at most 16777216 tokens per micro-batch"));
  auto precision = parse_matmul_precision(a.precision);
  if (!precision.ok()) return report(precision.status());
  c.precision = precision->value_or(MatmulPrecision::kBF16) == MatmulPrecision::kF32 ? "f32" : "bf16";
  c.ranks = &ranks;
  if (ranks.rank() != 0) a.quiet = true;  // progress from rank 0 only
  auto trainer = diffucoder::Trainer::create(c);
  if (!trainer.ok()) return report(trainer.status());
  diffucoder::Trainer& t = **trainer;
  if (!t.resume_note().empty() && !a.quiet) std::fprintf(stderr, "%s\n", t.resume_note().c_str());
  if (!a.quiet) {
    const diffucoder::TrainDataCounts data = t.data_counts();
    std::fprintf(stderr,
                 "train: %lld sequences of %lld tokens (%lld skipped, %lld truncated); %lld steps from step %lld; %s on %s; "
                 "%d rank%s (%s)\n",
                 (long long)data.sequences, (long long)c.seq_len, (long long)data.skipped, (long long)data.truncated,
                 (long long)c.steps, (long long)t.steps_done(),
                 t.precision() == "bf16" ? "bf16 mixed precision" : "f32", t.info().device.c_str(), ranks.size(),
                 ranks.size() > 1 ? (c.lora_r > 0 ? "s, the adapters' gradients summed" : "s, ZeRO-sharded optimizer state") : "",
                 ranks.backend().c_str());
    if (c.lora_r > 0)
      std::fprintf(stderr, "train: LoRA r=%lld alpha=%g on %s (dropout %g) over the frozen base; checkpoints are PEFT adapters\n",
                   (long long)c.lora_r, c.lora_alpha > 0 ? c.lora_alpha : static_cast<double>(c.lora_r),
                   c.lora_targets.c_str(), c.lora_dropout);
  }
  double seconds = 0;
  int64_t tokens = 0, done_here = 0;
  while (t.steps_done() < c.steps) {
    auto s = t.step();
    if (!s.ok()) return report(s.status());
    seconds += s->seconds, tokens += s->tokens, ++done_here;
    if (s->skipped && ranks.rank() == 0) std::fprintf(stderr, "warning: %s\n", s->skip_note.c_str());  // even --quiet
    if (!a.quiet) {
      const double eta = seconds / done_here * (c.steps - s->step);
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f  lr %.3e  |g| %.3e  %.0f tok/s  ETA %.0f s\n",
                   (long long)s->step, (long long)c.steps, s->loss, s->lr, s->grad_norm,
                   s->seconds > 0 ? s->tokens / s->seconds : 0.0, eta);
    }
    if (a.exit_after > 0 && s->step == a.exit_after && (a.exit_rank < 0 || a.exit_rank == ranks.rank()))
      std::_Exit(137);
  }
  const diffucoder::Status saved = t.save();
  if (!saved.ok()) return report(saved);
  auto gathered = t.gather_rank_stats();
  if (!gathered.ok()) return report(gathered.status());
  const RankNumbers numbers = report_rank_numbers(ranks.rank(), *gathered, a.quiet);
  if (ranks.rank() != 0) return 0;
  const std::vector<diffucoder::TrainStepStats> history = t.history();  // resumed: metrics.jsonl's steps first
  // Built with json_number / json_string: a non-finite loss prints as null, the path escaped.
  std::printf("{\"steps\": %lld, \"final_loss\": %s, \"tokens_per_s\": %s, \"skipped_steps\": %lld, \"out\": %s, "
              "\"ranks\": %d, %s}\n",
              (long long)t.steps_done(), json_number(history.empty() ? 0.0 : history.back().loss).c_str(),
              json_number(seconds > 0 ? tokens / seconds : 0.0, 6).c_str(), (long long)t.skipped_steps(),
              json_string(c.out_dir).c_str(), ranks.size(), numbers.json.c_str());
  return 0;
}

// AdamW's betas: 1 divides by 1 − β^t = 0 in the bias correction (NaN weights).
const CLI::Validator kBelowOne(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      return end == text.c_str() + text.size() && v >= 1.0 ? "must be below 1 (got " + text + ")" : "";
    },
    "< 1", "below_one");

}  // namespace

void add_optimizer_flags(CLI::App* cmd, const OptimizerFlags& to) {
  cmd->add_option("--lr", *to.lr, "Peak learning rate")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr-schedule", *to.schedule, "constant, linear or cosine")->capture_default_str()
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  cmd->add_option("--min-lr-ratio", *to.min_lr_ratio, "Final rate / peak rate (linear, cosine)")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--beta1", *to.beta1, "AdamW beta1")->capture_default_str()->check(CLI::Range(0.0, 1.0))
      ->check(kBelowOne);
  cmd->add_option("--beta2", *to.beta2, "AdamW beta2")->capture_default_str()->check(CLI::Range(0.0, 1.0))
      ->check(kBelowOne);
  cmd->add_option("--adam-eps", *to.adam_eps, "AdamW eps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--weight-decay", *to.weight_decay, "Decoupled weight decay (matrices only)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-grad-norm", *to.max_grad_norm, "Global gradient-norm clip (0: none)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

void add_lora_flags(CLI::App* cmd, const LoraFlags& to) {
  cmd->add_option("--lora-r", *to.r, "Train LoRA adapters of this rank over the frozen base (0: a full fine-tune; docs/lora.md)")
      ->capture_default_str()->check(CLI::Range(0, 65536));
  cmd->add_option("--lora-alpha", *to.alpha, "LoRA alpha (the update is scaled by alpha / r; 0: = r)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--lora-targets", *to.targets,
                  "Projections to adapt: all-linear, or a comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
      ->capture_default_str();
  cmd->add_option("--lora-dropout", *to.dropout, "Dropout on the adapters' input, in [0, 1)")->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
}

void add_dist_timeout_flag(CLI::App* cmd, double* seconds) {
  cmd->add_option("--dist-timeout", *seconds,
                  "Under mpirun: seconds a rank waits for the others in one collective before ending the job (0: no limit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
}

RunFn add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  diffucoder::TrainConfig& o = a->config;
  CLI::App* cmd = app.add_subcommand("train", "Masked-diffusion fine-tuning (SFT or continued pre-training) on CPU");
  cmd->add_option("--model", o.model_dir, "Hugging Face checkpoint directory to start from, or a dream F32 / F16 / BF16 FILE.gguf")->required();
  cmd->add_option("--data", o.data_path, "JSONL ({\"prompt\",\"completion\"} or {\"messages\"}) or a plain text file")
      ->required();
  cmd->add_option("--out", o.out_dir, "Output directory (checkpoints, metrics.jsonl, loss.svg)")->required();
  cmd->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", o.seq_len, "Canvas length in tokens")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--batch-size", o.batch_size, "Sequences per micro-batch")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches per optimizer step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup-steps", o.warmup_steps, "Linear warmup steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  add_optimizer_flags(cmd, {&o.lr, &o.lr_schedule, &o.min_lr_ratio, &o.beta1, &o.beta2, &o.adam_eps, &o.weight_decay,
                            &o.max_grad_norm});
  cmd->add_option("--seed", o.seed, "Seed of the data order and the masks")->capture_default_str();
  cmd->add_option("--t-eps", o.t_eps, "Mask ratio t ~ U(eps, 1)")->capture_default_str()->check(CLI::Range(1e-9, 0.999));
  cmd->add_option("--loss-norm", o.loss_norm, "tokens: ÷ maskable tokens of the batch; sequences: LLaDA's ÷ answer length, mean over the batch")
      ->capture_default_str()->check(CLI::IsMember({"tokens", "sequences"}));
  cmd->add_option("--pad-id", o.pad_token_id, "Canvas fill token (-1: <|dlm_pad|>, else config pad_token_id)")
      ->capture_default_str();
  cmd->add_flag("--instruct-template", o.instruct_template,
                "Wrap {\"prompt\"} in the DiffuCoder-Instruct chat format and end completions with <|im_end|>");
  cmd->add_option("--device", o.device,
                  "Where the steps run: cpu | vulkan | vulkan:N | vulkan:A,B,... (`diffucoder devices`; f32; LoRA "
                  "without dropout, in one process; under mpirun vulkan is the rank's local index, vulkan:N every "
                  "rank's, A,B,... by local rank)")
      ->capture_default_str();
  cmd->add_flag("--grad-checkpointing", o.grad_checkpointing,
                "Keep only each layer's input and recompute the layer in the backward (less memory, ~1/3 more compute)");
  add_lora_flags(cmd, {&o.lora_r, &o.lora_alpha, &o.lora_targets, &o.lora_dropout});
  cmd->add_option("--save-every", o.save_every, "Checkpoint every N steps (0: only at the end)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--resume", o.resume, "Continue from the newest checkpoint in --out");
  cmd->add_flag("--force", o.force, "Start over even if --out holds checkpoints");
  cmd->add_option("--threads", o.threads, "Threads (0: all hardware threads)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--precision", a->precision,
                  "bf16: mixed precision (f32 master weights, bf16 GEMMs; the default) | f32: every GEMM in f32")
      ->capture_default_str();
  cmd->add_flag("--quiet", a->quiet, "No progress on stderr");
  cmd->add_option("--exit-after-step", a->exit_after, "Testing: exit abruptly (code 137) after this step")
      ->group("");
  cmd->add_option("--exit-rank", a->exit_rank, "Testing: only this rank exits at --exit-after-step")->group("");
  add_dist_timeout_flag(cmd, &a->dist_timeout);
  require_finite_floats(cmd);
  // Under mpirun the ranks first check that they run with the same options and data (cli/ranks_agree.h).
  return [a, cmd] {
    return run_on_ranks(a->dist_timeout, [a, cmd](diffucoder::Ranks& ranks) {
      const int disagreed = check_ranks_agree(ranks, *cmd);
      return disagreed != 0 ? disagreed : run_train(*a, ranks);
    });
  };
}

}  // namespace dc::cli
