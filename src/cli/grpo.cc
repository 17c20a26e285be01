// `diffucoder grpo --model DIR --data FILE.jsonl --out DIR [...]`: Coupled-GRPO (spec §4) on the CPU or, with
// --device vulkan[:N], on a device (train/device_training.h; the rewards stay on the CPU), built on the
// public API (diffucoder::GrpoTrainer over src/train/: rollouts from the policy, rewards in the sandbox, the
// coupled loss and the optimizer loop); a progress line per step, metrics.jsonl, reward.svg, checkpoints.
// Under `mpirun -np N` (MPI built in, diffucoder::Ranks): data parallel, each rank generating and scoring
// whole groups with its own rollout seed (seed + rank, as accelerate's device-specific seed), ZeRO-sharded
// optimizer state; rank 0 shows the progress and prints the result, every rank's peak memory gathered.
#include <CLI/CLI.hpp>

#include <diffucoder/diffucoder.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranks_agree.h"

namespace dc::cli {
namespace {

struct GrpoArgs {
  diffucoder::GrpoConfig config;
  std::string precision = "bf16";  // also "auto" (= bf16), as the other commands' --precision
  bool no_random_masking = false, no_overlap_rewards = false, quiet = false;
  int64_t exit_after = 0;  // tests: _exit(137) right after this step, as a kill would
  double dist_timeout = 600;
};

std::string metric(const diffucoder::GrpoStepStats& s, const std::string& name) {
  const std::optional<double> value = s.metric(name);
  if (!value) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", *value);
  return buf;
}

void print_start(const diffucoder::GrpoConfig& c, const diffucoder::GrpoTrainer& t, const diffucoder::Ranks& ranks) {
  std::fprintf(stderr,
               "grpo: %lld prompts (%lld left-truncated); %lld steps from step %lld, %lld completions per prompt, "
               "%lld prompts per round, %lld iterations per round; %s on %s; %d rank%s (%s)\n",
               (long long)t.prompts(), (long long)t.truncated_prompts(), (long long)t.steps(),
               (long long)t.steps_done(), (long long)c.num_generations, (long long)c.prompts_per_round,
               (long long)c.num_iterations, t.precision() == "bf16" ? "bf16 mixed precision" : "f32", t.device().c_str(),
               ranks.size(), ranks.size() > 1 ? (c.lora_r > 0 ? "s, the adapters' gradients summed" : "s, ZeRO-sharded optimizer state") : "",
               ranks.backend().c_str());
  if (c.lora_r > 0)
    std::fprintf(stderr, "grpo: LoRA r=%lld alpha=%g on %s (dropout %g) over the frozen base; the reference model is the "
                 "base plus the adapters' reference copy; checkpoints are PEFT adapters\n", (long long)c.lora_r,
                 c.lora_alpha > 0 ? c.lora_alpha : static_cast<double>(c.lora_r), t.lora_targets().c_str(),
                 static_cast<float>(c.lora_dropout));
  if (!t.sandbox_note().empty()) std::fprintf(stderr, "%s\n", t.sandbox_note().c_str());  // how a test run's memory is bounded
}

// The optimizer steps left, a progress line each (unless quiet); *seconds and *done_here: what this
// process ran. A failing step's error is returned.
diffucoder::Status run_steps(const GrpoArgs& a, diffucoder::GrpoTrainer& t, int rank, double* seconds, int64_t* done_here) {
  while (t.steps_done() < t.steps()) {
    auto s = t.step();
    if (!s.ok()) return s.status();
    *seconds += s->seconds, ++*done_here;
    if (s->skipped && rank == 0) std::fprintf(stderr, "warning: %s\n", s->skip_note.c_str());  // even --quiet
    if (!a.quiet) {
      const double eta = *seconds / static_cast<double>(*done_here) * static_cast<double>(t.steps() - s->step);
      std::fprintf(stderr,
                   "step %5lld/%lld  reward %.3f ± %.3f  pass %s  format %s  kl %.4f  clip %.3f  loss %.4f  |g| %.3e  "
                   "lr %.2e  rollout %s tok/s  rewards %s s (%s s waited)  ETA %.0f s\n",
                   (long long)s->step, (long long)t.steps(), s->reward_mean, s->reward_std,
                   metric(*s, "pass_rate").c_str(), metric(*s, "format_rate").c_str(), s->kl, s->clip_fraction, s->loss,
                   s->grad_norm, s->lr, metric(*s, "rollout_tokens_per_s").c_str(), metric(*s, "reward_seconds").c_str(),
                   metric(*s, "reward_wait_seconds").c_str(), eta);
    }
    if (a.exit_after > 0 && s->step == a.exit_after) std::_Exit(137);
  }
  return diffucoder::Status();
}

// The last checkpoint, every rank's memory gathered, and rank 0's JSON result line; the exit code.
int finish_run(const GrpoArgs& a, diffucoder::GrpoTrainer& t, const diffucoder::Ranks& ranks, double seconds) {
  const diffucoder::Status saved = t.save();
  if (!saved.ok()) return report(saved);
  auto gathered = t.gather_rank_stats();
  if (!gathered.ok()) return report(gathered.status());
  const RankNumbers numbers = report_rank_numbers(ranks.rank(), *gathered, a.quiet);
  if (ranks.rank() != 0) return 0;
  const std::vector<diffucoder::GrpoStepStats> history = t.history();  // resumed: metrics.jsonl's steps first
  // Built with json_number / json_string: a non-finite number prints as null, the path escaped.
  std::printf("{\"steps\": %lld, \"final_reward_mean\": %s, \"seconds\": %s, \"skipped_steps\": %lld, \"out\": %s, "
              "\"ranks\": %d, %s}\n",
              (long long)t.steps_done(), json_number(history.empty() ? 0.0 : history.back().reward_mean, 6).c_str(),
              json_number(seconds, 6).c_str(), (long long)t.skipped_steps(), json_string(a.config.out_dir).c_str(),
              ranks.size(), numbers.json.c_str());
  return 0;
}

int run_grpo(GrpoArgs& a, diffucoder::Ranks& ranks) {
  diffucoder::GrpoConfig& c = a.config;
  c.ranks = &ranks;
  c.random_masking = !a.no_random_masking, c.overlap_rewards = !a.no_overlap_rewards;
  if (ranks.rank() != 0) a.quiet = true;  // progress from rank 0 only
  auto precision = parse_matmul_precision(a.precision);
  if (!precision.ok()) return usage_error(precision.status());
  c.precision = precision->value_or(MatmulPrecision::kBF16) == MatmulPrecision::kF32 ? "f32" : "bf16";
  // The flags' values that need checks beyond CLI11's (the LoRA targets, a reward on): a usage error.
  if (const diffucoder::Status s = diffucoder::check_grpo_config(c); !s.ok()) return usage_error(s);
  auto trainer = diffucoder::GrpoTrainer::create(c);
  if (!trainer.ok()) return report(trainer.status());
  diffucoder::GrpoTrainer& t = **trainer;
  if (!a.quiet) print_start(c, t, ranks);
  double seconds = 0;
  int64_t done_here = 0;
  if (const diffucoder::Status s = run_steps(a, t, ranks.rank(), &seconds, &done_here); !s.ok()) return report(s);
  return finish_run(a, t, ranks, seconds);
}

}  // namespace

RunFn add_grpo_command(CLI::App& app) {
  auto a = std::make_shared<GrpoArgs>();
  diffucoder::GrpoConfig& o = a->config;
  CLI::App* cmd = app.add_subcommand("grpo", "Coupled-GRPO reinforcement learning (DiffuCoder's recipe) on the CPU or a Vulkan device");
  cmd->add_option("--model", o.model_dir, "Hugging Face checkpoint directory of the policy (with tokenizer.json), or a dream F32 / F16 / BF16 FILE.gguf")
      ->required();
  cmd->add_option("--data", o.data_path, "JSONL: {prompt|messages, tests} or AceCode {question, test_cases}")->required();
  cmd->add_option("--out", o.out_dir, "Output directory (checkpoints, metrics.jsonl, reward.svg)")->required();
  cmd->add_option("--steps", o.steps, "Optimizer steps, a multiple of --num-iterations (0: one epoch)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--num-generations", o.num_generations, "Completions per prompt (G)")->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1024}));
  cmd->add_option("--prompts-per-round", o.prompts_per_round, "Prompts per generation round")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches per optimizer step (the round's completions split evenly)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--num-iterations", o.num_iterations, "Optimizer steps per round (each with its own mask seed)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--max-prompt-length", o.max_prompt_length, "Prompt tokens kept (the last ones)")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-completion-length", o.max_completion_length, "New tokens per completion")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--diffusion-steps", o.diffusion_steps, "Decoding steps of a rollout")->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--temperature", o.temperature, "Rollout temperature")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", o.top_p, "Rollout top-p (when temperature > 0)")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--fast", o.fast, "Faster, APPROXIMATE rollouts: block decoding with a dual KV cache and threshold "
                                   "commits (not the policy's own distribution; the loss still scores exactly)");
  cmd->add_option("--generation-batch-size", o.generation_batch_size,
                  "Completions per generation, a multiple of --num-generations (0: a rank's round at once)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_flag("--no-overlap-rewards", a->no_overlap_rewards, "Score each chunk's rewards before generating the next and "
                "before the round's log-probs (the same results, slower; default: on a worker thread meanwhile)");
  add_optimizer_flags(cmd, {&o.lr, &o.lr_schedule, &o.min_lr_ratio, &o.beta1, &o.beta2, &o.adam_eps, &o.weight_decay,
                            &o.max_grad_norm});
  cmd->add_option("--warmup-ratio", o.warmup_ratio, "Warmup steps / steps")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--beta", o.beta, "KL coefficient (k3 estimator against the reference model)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--epsilon", o.epsilon, "Ratio clip: [1 - epsilon, 1 + epsilon]")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--scale-rewards", o.scale_rewards, "Divide the advantages by the group's reward std (+1e-4)");
  cmd->add_flag("--no-random-masking", a->no_random_masking, "Mask seed 42 for every iteration (else drawn per round)");
  cmd->add_option("--ref-sync-steps", o.ref_sync_steps, "Mix the policy into the reference model every N steps (0: never)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--ref-mixup-alpha", o.ref_mixup_alpha, "ref = (1 - alpha)·ref + alpha·policy at a sync")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--code-weight", o.code_weight, "Weight of the code reward (test pass rate; 0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--format-weight", o.format_weight, "Weight of the code_format reward (0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--test-timeout", o.test_timeout, "Seconds per test case in the sandbox")
      ->capture_default_str()->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--reward-workers", o.reward_workers, "Sandboxes at once (0: hardware threads)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_option("--reward-program", o.reward_program,
                  "Your own reward: an executable and its arguments (JSON lines in, one score per line out)")
      ->expected(1, 64);
  cmd->add_option("--reward-weight", o.reward_weight, "Weight of --reward-program's score")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the prompt order, rollouts and mask seeds")->capture_default_str();
  cmd->add_flag("--grad-checkpointing", o.grad_checkpointing, "Keep only each layer's input and recompute it in the backward");
  add_lora_flags(cmd, {&o.lora_r, &o.lora_alpha, &o.lora_targets, &o.lora_dropout});
  cmd->add_option("--precision", a->precision, "bf16: mixed precision (the default) | f32")->capture_default_str();
  cmd->add_option("--device", o.device, "Where the rollouts and steps run: cpu | vulkan | vulkan:N | vulkan:A,B,... "
                  "(`diffucoder devices`; f32; LoRA without dropout, in one process; the rewards stay on the CPU; "
                  "under mpirun as train's)")->capture_default_str();
  cmd->add_option("--save-every", o.save_every, "Checkpoint every N rounds (0: only at the end)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--resume", o.resume, "Continue from the newest checkpoint in --out");
  cmd->add_flag("--force", o.force, "Start over even if --out holds checkpoints");
  cmd->add_option("--threads", o.threads, "Threads (0: all hardware threads)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_flag("--quiet", a->quiet, "No progress on stderr");
  cmd->add_option("--exit-after-step", a->exit_after, "Testing: exit abruptly (code 137) after this step")->group("");
  add_dist_timeout_flag(cmd, &a->dist_timeout);
  require_finite_floats(cmd);
  // Under mpirun the ranks first check that they run with the same options and data (cli/ranks_agree.h).
  return [a, cmd] {
    return run_on_ranks(a->dist_timeout, [a, cmd](diffucoder::Ranks& ranks) {
      const int disagreed = check_ranks_agree(ranks, *cmd);
      return disagreed != 0 ? disagreed : run_grpo(*a, ranks);
    });
  };
}

}  // namespace dc::cli
