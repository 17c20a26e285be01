// `diffucoder train --model DIR --data FILE --out DIR [...]`: masked-diffusion fine-tuning on CPU
// (src/train/); a progress line per step on stderr, metrics.jsonl, loss.svg and checkpoints in --out.
// Under `mpirun -np N` (MPI built in, src/dist/): data parallel with ZeRO-sharded optimizer state; rank 0
// shows the progress and prints the result, every rank's peak memory gathered.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranks_agree.h"
#include "dist/comm.h"
#include "train/trainer.h"

namespace dc::cli {
namespace {

struct TrainArgs {
  train::TrainOptions opt;
  std::string schedule = "cosine", loss_norm = "tokens", precision = "bf16";
  int threads = 0;
  bool quiet = false;
  int64_t exit_after = 0;  // tests: _exit(137) right after this step, as a kill would
  int exit_rank = -1;      // tests: only this rank exits (-1: every rank)
  double dist_timeout = 600;
};

int run_train(TrainArgs& a, dist::Comm& comm) {
  if (a.opt.batch_size * a.opt.seq_len > (int64_t{1} << 24))
    return usage_error(invalid_argument("--batch-size × --seq-len must be at most 16777216 tokens per micro-batch"));
  auto schedule = train::parse_lr_schedule(a.schedule);
  if (!schedule.ok()) return usage_error(schedule.status());
  a.opt.lr.schedule = *schedule;
  a.opt.lr.total_steps = a.opt.steps;
  a.opt.masking.norm = a.loss_norm == "sequences" ? train::LossNorm::kSequences : train::LossNorm::kTokens;
  auto precision = parse_matmul_precision(a.precision);
  if (!precision.ok()) return report(precision.status());
  a.opt.precision = precision->value_or(MatmulPrecision::kBF16);
  ThreadPool pool(a.threads);
  Context ctx;
  ctx.pool = &pool;
  if (comm.size() > 1) a.opt.comm = &comm;
  if (comm.rank() != 0) a.quiet = true;  // progress from rank 0 only
  auto trainer = train::Trainer::create(a.opt, ctx);
  if (!trainer.ok()) return report(trainer.status());
  train::Trainer& t = **trainer;
  if (!t.resume_note().empty() && !a.quiet) std::fprintf(stderr, "%s\n", t.resume_note().c_str());
  if (!a.quiet)
    std::fprintf(stderr,
                 "train: %zu sequences of %lld tokens (%lld skipped, %lld truncated); %lld steps from step %lld; %s; "
                 "%d rank%s (%s)\n",
                 t.dataset().sequences.size(), (long long)a.opt.seq_len, (long long)t.dataset().n_skipped,
                 (long long)t.dataset().n_truncated, (long long)a.opt.steps, (long long)t.steps_done(),
                 t.precision() == MatmulPrecision::kBF16 ? "bf16 mixed precision" : "f32", comm.size(),
                 comm.size() > 1 ? "s, ZeRO-sharded optimizer state" : "", comm.backend());
  double seconds = 0;
  int64_t tokens = 0, done_here = 0;
  while (t.steps_done() < a.opt.steps) {
    auto s = t.step();
    if (!s.ok()) return report(s.status());
    seconds += s->seconds, tokens += s->tokens, ++done_here;
    if (s->skipped && comm.rank() == 0) std::fprintf(stderr, "warning: %s\n", s->skip_note.c_str());  // even --quiet
    if (!a.quiet) {
      const double eta = seconds / done_here * (a.opt.steps - s->step);
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f  lr %.3e  |g| %.3e  %.0f tok/s  ETA %.0f s\n",
                   (long long)s->step, (long long)a.opt.steps, s->loss, s->lr, s->grad_norm,
                   s->seconds > 0 ? s->tokens / s->seconds : 0.0, eta);
    }
    if (a.exit_after > 0 && s->step == a.exit_after && (a.exit_rank < 0 || a.exit_rank == comm.rank()))
      std::_Exit(137);
  }
  const Status saved = t.save();
  if (!saved.ok()) return report(saved);
  const RankNumbers ranks = gather_rank_numbers(comm, t.optimizer().master_weight_bytes(), t.optimizer().optimizer_state_bytes(),
                                                   t.optimizer().gradient_bytes(), done_here, a.quiet);
  if (!ranks.ok) return 1;
  if (comm.rank() != 0) return 0;
  const int64_t skipped = t.optimizer().state().skipped_steps;  // over the whole run, resumes included
  // Built with json_number / json_string: a non-finite loss prints as null, the path escaped.
  std::printf("{\"steps\": %lld, \"final_loss\": %s, \"tokens_per_s\": %s, \"skipped_steps\": %lld, \"out\": %s, "
              "\"ranks\": %d, %s}\n",
              (long long)t.steps_done(), json_number(t.history().empty() ? 0.0 : t.history().back().loss).c_str(),
              json_number(seconds > 0 ? tokens / seconds : 0.0, 6).c_str(), (long long)skipped,
              json_string(a.opt.out_dir).c_str(), comm.size(), ranks.json.c_str());
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

void add_optimizer_flags(CLI::App* cmd, train::LrOptions* lr, std::string* schedule, train::AdamWOptions* adam,
                         double* max_grad_norm) {
  cmd->add_option("--lr", lr->lr, "Peak learning rate")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--lr-schedule", *schedule, "constant, linear or cosine")->capture_default_str()
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  cmd->add_option("--min-lr-ratio", lr->min_lr_ratio, "Final rate / peak rate (linear, cosine)")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--beta1", adam->beta1, "AdamW beta1")->capture_default_str()->check(CLI::Range(0.0, 1.0))
      ->check(kBelowOne);
  cmd->add_option("--beta2", adam->beta2, "AdamW beta2")->capture_default_str()->check(CLI::Range(0.0, 1.0))
      ->check(kBelowOne);
  cmd->add_option("--adam-eps", adam->eps, "AdamW eps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--weight-decay", adam->weight_decay, "Decoupled weight decay (matrices only)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-grad-norm", *max_grad_norm, "Global gradient-norm clip (0: none)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

void add_dist_timeout_flag(CLI::App* cmd, double* seconds) {
  cmd->add_option("--dist-timeout", *seconds,
                  "Under mpirun: seconds a rank waits for the others in one collective before ending the job (0: no limit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
}

RunFn add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  train::TrainOptions& o = a->opt;
  CLI::App* cmd = app.add_subcommand("train", "Masked-diffusion fine-tuning (SFT or continued pre-training) on CPU");
  cmd->add_option("--model", o.model_dir, "Hugging Face checkpoint directory to start from, or a dream F32 / F16 / BF16 FILE.gguf")->required();
  cmd->add_option("--data", o.data_path, "JSONL ({\"prompt\",\"completion\"} or {\"messages\"}) or a plain text file")
      ->required();
  cmd->add_option("--out", o.out_dir, "Output directory (checkpoints, metrics.jsonl, loss.svg)")->required();
  cmd->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seq-len", o.seq_len, "Canvas length in tokens")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--batch-size", o.batch_size, "Sequences per micro-batch")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches per optimizer step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--warmup-steps", o.lr.warmup_steps, "Linear warmup steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  add_optimizer_flags(cmd, &o.lr, &a->schedule, &o.adam, &o.max_grad_norm);
  cmd->add_option("--seed", o.seed, "Seed of the data order and the masks")->capture_default_str();
  cmd->add_option("--t-eps", o.masking.eps, "Mask ratio t ~ U(eps, 1)")->capture_default_str()->check(CLI::Range(1e-9, 0.999));
  cmd->add_option("--loss-norm", a->loss_norm, "tokens: ÷ maskable tokens of the batch; sequences: LLaDA's ÷ answer length, mean over the batch")
      ->capture_default_str()->check(CLI::IsMember({"tokens", "sequences"}));
  cmd->add_option("--pad-id", o.pad_token_id, "Canvas fill token (-1: <|dlm_pad|>, else config pad_token_id)")
      ->capture_default_str();
  cmd->add_flag("--instruct-template", o.instruct_template,
                "Wrap {\"prompt\"} in the DiffuCoder-Instruct chat format and end completions with <|im_end|>");
  cmd->add_flag("--grad-checkpointing", o.recompute,
                "Keep only each layer's input and recompute the layer in the backward (less memory, ~1/3 more compute)");
  cmd->add_option("--save-every", o.save_every, "Checkpoint every N steps (0: only at the end)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--resume", o.resume, "Continue from the newest checkpoint in --out");
  cmd->add_flag("--force", o.force, "Start over even if --out holds checkpoints");
  cmd->add_option("--threads", a->threads, "Threads (0: all hardware threads)")->capture_default_str()
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
    return run_on_ranks(a->dist_timeout, [a, cmd](dist::Comm& comm) {
      const int disagreed = check_ranks_agree(comm, *cmd);
      return disagreed != 0 ? disagreed : run_train(*a, comm);
    });
  };
}

}  // namespace dc::cli
