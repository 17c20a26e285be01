// `diffucoder grpo --model DIR --data FILE.jsonl --out DIR [...]`: Coupled-GRPO on CPU (spec §4): rollouts
// from the policy (train/rollout.h), rewards in the sandbox (train/rewards.h), the coupled loss and the
// optimizer loop (train/grpo_trainer.h); a progress line per step, metrics.jsonl, reward.svg, checkpoints.
// Under `mpirun -np N` (MPI built in, src/dist/): data parallel, each rank generating and scoring whole
// groups with its own rollout seed (seed + rank, as accelerate's device-specific seed), ZeRO-sharded
// optimizer state; rank 0 shows the progress and prints the result, every rank's peak memory gathered.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/ranks_agree.h"
#include "gguf/model_source.h"
#include "sandbox/sandbox.h"
#include "tokenizer/tokenizer.h"
#include "train/grpo_data.h"
#include "train/grpo_trainer.h"
#include "train/rewards.h"
#include "lora/trainable.h"
#include "train/rng.h"
#include "train/rollout.h"

namespace dc::cli {
namespace {

struct GrpoArgs {
  train::GrpoOptions opt;
  std::string data_path, schedule = "cosine", precision = "bf16";
  int64_t max_prompt_length = 200, max_completion_length = 256;
  int diffusion_steps = 256;
  float temperature = 1.0f, top_p = 0.95f;
  bool fast = false, no_random_masking = false, quiet = false;
  std::vector<std::string> reward_program;
  train::RewardOptions rewards;
  int threads = 0;
  int64_t lora_r = 0;  // --lora-*: parsed into opt.lora when the run starts
  double lora_alpha = 0, lora_dropout = 0;
  std::string lora_targets = "all-linear";
  int64_t exit_after = 0;  // tests: _exit(137) right after this step, as a kill would
  double dist_timeout = 600;
};

std::string metric(const train::GrpoStepStats& s, const std::string& name) {
  for (const auto& [key, value] : s.metrics)
    if (key == name) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.3f", value);
      return buf;
    }
  return "-";
}

// The flags that need parsing or checks beyond CLI11's into a.opt / a.rewards; a usage error otherwise.
Status finish_options(GrpoArgs& a) {
  DC_ASSIGN_OR_RETURN(a.opt.lr.schedule, train::parse_lr_schedule(a.schedule));
  DC_ASSIGN_OR_RETURN(std::optional<MatmulPrecision> precision, parse_matmul_precision(a.precision));
  a.opt.precision = precision.value_or(MatmulPrecision::kBF16);
  a.opt.random_masking = !a.no_random_masking;
  if (a.lora_r > 0) {
    a.opt.lora.r = a.lora_r, a.opt.lora.alpha = a.lora_alpha, a.opt.lora.dropout = static_cast<float>(a.lora_dropout);
    DC_ASSIGN_OR_RETURN(a.opt.lora.targets, parse_lora_targets(a.lora_targets));
    DC_RETURN_IF_ERROR(check_lora_spec(a.opt.lora));
  }
  a.rewards.user.argv = a.reward_program;
  if (a.rewards.user.argv.empty() && a.rewards.code_weight == 0 && a.rewards.format_weight == 0)
    return invalid_argument("every reward is off: give --code-weight, --format-weight or --reward-program");
  return Status();
}

// The rollouts' decoding: the recipe's (train/rollout.h) with the flags' lengths, steps and sampling.
train::RolloutOptions rollout_options(const GrpoArgs& a, const ModelConfig& config, const Tokenizer& tokenizer) {
  train::RolloutOptions ro;
  ro.group_size = a.opt.group_size;
  ro.sampling = train::recipe_rollout_params(config);
  ro.sampling.max_new_tokens = a.max_completion_length;
  ro.sampling.steps = a.diffusion_steps;
  ro.sampling.temperature = a.temperature;
  ro.sampling.top_p = a.temperature > 0 ? a.top_p : 1.0f;  // the reference: top_p only when sampling
  if (a.fast) apply_fast_mode(ro.sampling);
  if (const auto im_end = tokenizer.token_to_id("<|im_end|>")) ro.im_end_id = *im_end;
  return ro;
}

// One round's rollouts of this rank's prompts: generated from the policy (seeded by `seed` and the round),
// scored in the sandbox, laid out as the trainer's batch (with the prompts' padding mask).
train::RolloutFn make_rollout_fn(const train::GrpoDataset& ds, const Tokenizer& tok, const train::RolloutOptions& ro,
                                 uint64_t seed, const train::RewardOptions& rewards) {
  return [&ds, &tok, ro, seed, rewards](const Context& ctx, const Model& policy, int64_t round,
                                        const std::vector<int64_t>& prompts) -> Result<train::Rollout> {
    std::vector<std::vector<int32_t>> ids;
    std::vector<const train::GrpoExample*> examples;
    for (int64_t p : prompts) ids.push_back(ds.examples[p].prompt_ids), examples.push_back(&ds.examples[p]);
    DC_ASSIGN_OR_RETURN(train::RolloutBatch rb, train::generate_rollouts(ctx, policy, tok, ids, ro,
                                                                         train::hash_counters(seed, 0x726f6c6c, round)));
    DC_ASSIGN_OR_RETURN(std::vector<train::RewardInput> inputs, train::reward_inputs(rb, examples));
    DC_ASSIGN_OR_RETURN(train::RewardBatch rw, train::score_completions(inputs, rewards));
    train::Rollout r;
    r.batch.n_batch = rb.n_rows, r.batch.n_prompt = rb.prompt_width, r.batch.n_completion = rb.completion_length;
    r.batch.prompt_ids = std::move(rb.prompt_ids);
    r.batch.prompt_mask = std::move(rb.prompt_mask);  // the scoring forward masks the pads as the rollout did
    r.batch.completion_ids = std::move(rb.completion_ids);
    r.batch.completion_mask = std::move(rb.completion_mask);
    r.rewards = rw.total;
    r.metrics = {{"pass_rate", rw.pass_rate()},
                 {"format_rate", rw.format_rate()},
                 {"rollout_tokens_per_s", rb.tokens_per_second()},
                 {"generate_seconds", rb.seconds},
                 {"reward_seconds", rw.seconds}};
    return r;
  };
}

void print_start(const GrpoArgs& a, const train::GrpoTrainer& t, const dist::Comm& comm, int64_t n_truncated) {
  std::fprintf(stderr,
               "grpo: %lld prompts (%lld left-truncated); %lld steps from step %lld, %lld completions per prompt, "
               "%lld prompts per round, %lld iterations per round; %s; %d rank%s (%s)\n",
               (long long)a.opt.n_prompts, (long long)n_truncated, (long long)a.opt.steps,
               (long long)t.steps_done(), (long long)a.opt.group_size, (long long)a.opt.prompts_per_round,
               (long long)a.opt.num_iterations, t.precision() == MatmulPrecision::kBF16 ? "bf16 mixed precision" : "f32",
               comm.size(), comm.size() > 1 ? (a.opt.lora.r > 0 ? "s, the adapters' gradients summed" : "s, ZeRO-sharded optimizer state") : "",
               comm.backend());
  if (a.opt.lora.r > 0)
    std::fprintf(stderr, "grpo: LoRA r=%lld alpha=%g on %s (dropout %g) over the frozen base; the reference model is the "
                 "base plus the adapters' reference copy; checkpoints are PEFT adapters\n", (long long)a.opt.lora.r,
                 a.opt.lora.alpha > 0 ? a.opt.lora.alpha : static_cast<double>(a.opt.lora.r),
                 lora_targets_text(a.opt.lora.targets).c_str(), a.opt.lora.dropout);
  if (comm.rank() == 0 && (a.rewards.code_weight != 0 || a.rewards.format_weight != 0))
    std::fprintf(stderr, "%s\n", sandbox::describe().c_str());  // how a test run's memory is bounded
}

// The optimizer steps left, a progress line each (unless quiet); *seconds and *done_here: what this
// process ran. A failing step's error is returned.
Status run_steps(const GrpoArgs& a, train::GrpoTrainer& t, const dist::Comm& comm, double* seconds, int64_t* done_here) {
  while (t.steps_done() < a.opt.steps) {
    DC_ASSIGN_OR_RETURN(const train::GrpoStepStats s, t.step());
    *seconds += s.seconds, ++*done_here;
    if (s.skipped && comm.rank() == 0) std::fprintf(stderr, "warning: %s\n", s.skip_note.c_str());  // even --quiet
    if (!a.quiet) {
      const double eta = *seconds / static_cast<double>(*done_here) * static_cast<double>(a.opt.steps - s.step);
      std::fprintf(stderr,
                   "step %5lld/%lld  reward %.3f ± %.3f  pass %s  format %s  kl %.4f  clip %.3f  loss %.4f  |g| %.3e  "
                   "lr %.2e  rollout %s tok/s  ETA %.0f s\n",
                   (long long)s.step, (long long)a.opt.steps, s.reward_mean, s.reward_std,
                   metric(s, "pass_rate").c_str(), metric(s, "format_rate").c_str(), s.kl, s.clip_fraction, s.loss,
                   s.grad_norm, s.lr, metric(s, "rollout_tokens_per_s").c_str(), eta);
    }
    if (a.exit_after > 0 && s.step == a.exit_after) std::_Exit(137);
  }
  return Status();
}

// The last checkpoint, every rank's memory gathered, and rank 0's JSON result line; the exit code.
int finish_run(const GrpoArgs& a, train::GrpoTrainer& t, dist::Comm& comm, double seconds, int64_t done_here) {
  const Status saved = t.save();
  if (!saved.ok()) return report(saved);
  const train::TrainFootprint held = t.footprint();
  const RankNumbers ranks = gather_rank_numbers(comm, held.master_weight_bytes, held.optimizer_state_bytes,
                                                   held.gradient_bytes, done_here, a.quiet);
  if (!ranks.ok) return 1;
  if (comm.rank() != 0) return 0;
  const int64_t skipped = held.skipped_steps;  // over the whole run, resumes included
  // Built with json_number / json_string: a non-finite number prints as null, the path escaped.
  std::printf("{\"steps\": %lld, \"final_reward_mean\": %s, \"seconds\": %s, \"skipped_steps\": %lld, \"out\": %s, "
              "\"ranks\": %d, %s}\n",
              (long long)t.steps_done(), json_number(t.history().empty() ? 0.0 : t.history().back().reward_mean, 6).c_str(),
              json_number(seconds, 6).c_str(), (long long)skipped, json_string(a.opt.out_dir).c_str(), comm.size(),
              ranks.json.c_str());
  return 0;
}

int run_grpo(GrpoArgs& a, dist::Comm& comm) {
  if (comm.size() > 1) a.opt.comm = &comm;
  if (comm.rank() != 0) a.quiet = true;  // progress from rank 0 only
  if (const Status s = finish_options(a); !s.ok()) return usage_error(s);
  auto tokenizer = model_source_tokenizer(a.opt.model_dir);
  if (!tokenizer.ok()) return report(tokenizer.status());
  train::GrpoDataOptions d;
  d.max_prompt_length = a.max_prompt_length;
  d.require_tests = a.rewards.code_weight != 0 || a.rewards.format_weight != 0;
  auto data = train::load_grpo_dataset(a.data_path, *tokenizer, d);
  if (!data.ok()) return report(data.status());
  auto config = model_source_config(a.opt.model_dir);
  if (!config.ok()) return report(config.status());
  const train::RolloutOptions ro = rollout_options(a, *config, *tokenizer);
  a.opt.n_prompts = static_cast<int64_t>(data->examples.size());
  if (a.opt.steps == 0) {  // one epoch: every prompt once
    const int64_t rounds = (a.opt.n_prompts + a.opt.prompts_per_round - 1) / a.opt.prompts_per_round;
    a.opt.steps = rounds * a.opt.num_iterations;
  }
  const uint64_t seed = a.opt.seed + static_cast<uint64_t>(comm.rank());  // each rank its own completions
  ThreadPool pool(a.threads);
  Context ctx;
  ctx.pool = &pool;
  auto trainer = train::GrpoTrainer::create(a.opt, ctx, make_rollout_fn(*data, *tokenizer, ro, seed, a.rewards));
  if (!trainer.ok()) return report(trainer.status());
  train::GrpoTrainer& t = **trainer;
  if (!a.quiet) print_start(a, t, comm, data->n_truncated);
  double seconds = 0;
  int64_t done_here = 0;
  if (const Status s = run_steps(a, t, comm, &seconds, &done_here); !s.ok()) return report(s);
  return finish_run(a, t, comm, seconds, done_here);
}

}  // namespace

RunFn add_grpo_command(CLI::App& app) {
  auto a = std::make_shared<GrpoArgs>();
  train::GrpoOptions& o = a->opt;
  o.steps = 0;
  CLI::App* cmd = app.add_subcommand("grpo", "Coupled-GRPO reinforcement learning (DiffuCoder's recipe) on CPU");
  cmd->add_option("--model", o.model_dir, "Hugging Face checkpoint directory of the policy (with tokenizer.json), or a dream F32 / F16 / BF16 FILE.gguf")
      ->required();
  cmd->add_option("--data", a->data_path, "JSONL: {prompt|messages, tests} or AceCode {question, test_cases}")->required();
  cmd->add_option("--out", o.out_dir, "Output directory (checkpoints, metrics.jsonl, reward.svg)")->required();
  cmd->add_option("--steps", o.steps, "Optimizer steps, a multiple of --num-iterations (0: one epoch)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--num-generations", o.group_size, "Completions per prompt (G)")->capture_default_str()
      ->check(CLI::Range(int64_t{2}, kMaxReturnSequences));
  cmd->add_option("--prompts-per-round", o.prompts_per_round, "Prompts per generation round")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches per optimizer step (the round's completions split evenly)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--num-iterations", o.num_iterations, "Optimizer steps per round (each with its own mask seed)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--max-prompt-length", a->max_prompt_length, "Prompt tokens kept (the last ones)")->capture_default_str()
      ->check(CLI::Range(int64_t{1}, train::kMaxGrpoPromptLength));
  cmd->add_option("--max-completion-length", a->max_completion_length, "New tokens per completion")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--diffusion-steps", a->diffusion_steps, "Decoding steps of a rollout")->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--temperature", a->temperature, "Rollout temperature")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", a->top_p, "Rollout top-p (when temperature > 0)")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--fast", a->fast, "Faster, APPROXIMATE rollouts: block decoding with a dual KV cache and threshold "
                                   "commits (not the policy's own distribution; the loss still scores exactly)");
  add_optimizer_flags(cmd, {&o.lr.lr, &a->schedule, &o.lr.min_lr_ratio, &o.adam.beta1, &o.adam.beta2, &o.adam.eps,
                            &o.adam.weight_decay, &o.max_grad_norm});
  cmd->add_option("--warmup-ratio", o.warmup_ratio, "Warmup steps / steps")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--beta", o.loss.beta, "KL coefficient (k3 estimator against the reference model)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--epsilon", o.loss.epsilon, "Ratio clip: [1 - epsilon, 1 + epsilon]")->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--scale-rewards", o.scale_rewards, "Divide the advantages by the group's reward std (+1e-4)");
  cmd->add_flag("--no-random-masking", a->no_random_masking, "Mask seed 42 for every iteration (else drawn per round)");
  cmd->add_option("--ref-sync-steps", o.ref_sync_steps, "Mix the policy into the reference model every N steps (0: never)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--ref-mixup-alpha", o.ref_mixup_alpha, "ref = (1 - alpha)·ref + alpha·policy at a sync")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--code-weight", a->rewards.code_weight, "Weight of the code reward (test pass rate; 0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--format-weight", a->rewards.format_weight, "Weight of the code_format reward (0: off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--test-timeout", a->rewards.code.timeout_seconds, "Seconds per test case in the sandbox")
      ->capture_default_str()->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--reward-workers", a->rewards.code.workers, "Sandboxes at once (0: hardware threads)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  cmd->add_option("--reward-program", a->reward_program,
                  "Your own reward: an executable and its arguments (JSON lines in, one score per line out)")
      ->expected(1, 64);
  cmd->add_option("--reward-weight", a->rewards.user_weight, "Weight of --reward-program's score")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the prompt order, rollouts and mask seeds")->capture_default_str();
  cmd->add_flag("--grad-checkpointing", o.recompute, "Keep only each layer's input and recompute it in the backward");
  add_lora_flags(cmd, {&a->lora_r, &a->lora_alpha, &a->lora_targets, &a->lora_dropout});
  cmd->add_option("--precision", a->precision, "bf16: mixed precision (the default) | f32")->capture_default_str();
  cmd->add_option("--save-every", o.save_every, "Checkpoint every N rounds (0: only at the end)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--resume", o.resume, "Continue from the newest checkpoint in --out");
  cmd->add_flag("--force", o.force, "Start over even if --out holds checkpoints");
  cmd->add_option("--threads", a->threads, "Threads (0: all hardware threads)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_flag("--quiet", a->quiet, "No progress on stderr");
  cmd->add_option("--exit-after-step", a->exit_after, "Testing: exit abruptly (code 137) after this step")->group("");
  add_dist_timeout_flag(cmd, &a->dist_timeout);
  require_finite_floats(cmd);
  // Under mpirun the ranks first check that they run with the same options and data (cli/ranks_agree.h).
  return [a, cmd] {
    return run_on_ranks(a->dist_timeout, [a, cmd](dist::Comm& comm) {
      const int disagreed = check_ranks_agree(comm, *cmd);
      return disagreed != 0 ? disagreed : run_grpo(*a, comm);
    });
  };
}

}  // namespace dc::cli
