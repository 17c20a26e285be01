// The public facade's GrpoTrainer (include/diffucoder/diffucoder.h) over train::GrpoTrainer: GrpoConfig
// checked field by field and turned into train::GrpoOptions, the data (train/grpo_data.h) and the rollouts
// (train/rollout.h: the policy's completions by the diffusion sampler, scored by train/rewards.h in the
// sandbox) that `diffucoder grpo` ran before it was built on this facade, the ranks from Ranks (api/ranks.h).
#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>

#include "api/ranks.h"
#include "api/status_convert.h"
#include "api/train_shared.h"
#include "core/thread_pool.h"
#include "gguf/model_source.h"
#include "ops/device.h"
#include "sampler/generate.h"
#include "sandbox/sandbox.h"
#include "tokenizer/tokenizer.h"
#include "train/grpo_data.h"
#include "train/grpo_trainer.h"
#include "train/reward_scorer.h"
#include "train/rewards.h"
#include "train/rng.h"
#include "train/rollout.h"

namespace diffucoder {

struct GrpoTrainer::Impl {
  // The tokenizer and the data before the trainer, whose rollout function reads them.
  std::optional<dc::Tokenizer> tokenizer;
  dc::train::GrpoDataset data;
  std::unique_ptr<dc::ThreadPool> pool;  // before the trainer, which keeps a Context pointing at it
  std::unique_ptr<dc::DeviceBackend> backend;  // GrpoConfig::device's (null: the CPU); before the trainer too
  std::unique_ptr<dc::train::GrpoTrainer> trainer;
  dc::dist::Comm* comm = nullptr;        // GrpoConfig::ranks' (null: this process alone)
  int64_t steps = 0, steps_here = 0;     // the run's length; step() calls that succeeded in this process
  bool sandboxed = false;                // the code or format reward is on
  std::string lora_targets;
  std::vector<GrpoRewardStats> round_rewards;  // of the latest rollout (this process's completions)
};

namespace {

// The rollouts' and rewards' fields.
dc::Status check_grpo_rollout_fields(const GrpoConfig& c) {
  const auto check_grpo_range = dc::api::check_number;
  DC_RETURN_IF_ERROR(check_grpo_range(c.max_prompt_length >= 1 && c.max_prompt_length <= dc::train::kMaxGrpoPromptLength,
                                      "max_prompt_length", "in [1, 1048576]", static_cast<double>(c.max_prompt_length)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.max_completion_length >= 1 && c.max_completion_length <= 65536,
                                      "max_completion_length", "in [1, 65536]", static_cast<double>(c.max_completion_length)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.diffusion_steps >= 1 && c.diffusion_steps <= 65536, "diffusion_steps",
                                      "in [1, 65536]", c.diffusion_steps));
  DC_RETURN_IF_ERROR(check_grpo_range(c.temperature >= 0 && c.temperature <= 100, "temperature", "in [0, 100]", c.temperature));
  DC_RETURN_IF_ERROR(check_grpo_range(c.top_p >= 0 && c.top_p <= 1, "top_p", "in [0, 1]", c.top_p));
  DC_RETURN_IF_ERROR(check_grpo_range(c.code_weight >= 0 && std::isfinite(c.code_weight), "code_weight",
                                      "at least 0 and finite (0: off)", c.code_weight));
  DC_RETURN_IF_ERROR(check_grpo_range(c.format_weight >= 0 && std::isfinite(c.format_weight), "format_weight",
                                      "at least 0 and finite (0: off)", c.format_weight));
  DC_RETURN_IF_ERROR(check_grpo_range(std::isfinite(c.reward_weight), "reward_weight", "finite", c.reward_weight));
  DC_RETURN_IF_ERROR(check_grpo_range(c.test_timeout >= 0.01 && c.test_timeout <= 3600, "test_timeout",
                                      "in [0.01, 3600] seconds", c.test_timeout));
  DC_RETURN_IF_ERROR(check_grpo_range(c.reward_workers >= 0 && c.reward_workers <= 1024, "reward_workers",
                                      "in [0, 1024] (0: the hardware threads)", c.reward_workers));
  DC_RETURN_IF_ERROR(check_grpo_range(c.test_memory_bytes >= 1, "test_memory_bytes", "at least 1",
                                      static_cast<double>(c.test_memory_bytes)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.test_max_processes >= 1, "test_max_processes", "at least 1",
                                      static_cast<double>(c.test_max_processes)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.generation_batch_size >= 0 && c.generation_batch_size <= (int64_t{1} << 20) &&
                                          c.generation_batch_size % std::max<int64_t>(c.num_generations, 1) == 0,
                                      "generation_batch_size", "a multiple of num_generations in [0, 1048576] (0: a round at once)",
                                      static_cast<double>(c.generation_batch_size)));
  if (c.reward_program.size() > 64 || (!c.reward_program.empty() && c.reward_program[0].empty()))
    return dc::invalid_argument("reward_program: an executable's path and at most 63 arguments, got " +
                                std::to_string(c.reward_program.size()) + " entries" +
                                (c.reward_program.empty() || !c.reward_program[0].empty() ? "" : ", the first empty"));
  if (c.reward_program.empty() && c.code_weight == 0 && c.format_weight == 0)
    return dc::invalid_argument("every reward is off: give --code-weight, --format-weight or --reward-program "
                                "(code_weight, format_weight, reward_program)");
  return dc::Status();
}

// The run's shape, the optimizer's and the loss's fields.
dc::Status check_grpo_fields(const GrpoConfig& c) {
  const auto check_grpo_range = dc::api::check_number;
  if (c.threads > dc::kMaxThreads)
    return dc::invalid_argument("threads: at most " + std::to_string(dc::kMaxThreads) + ", got " + std::to_string(c.threads));
  DC_RETURN_IF_ERROR(check_grpo_range(c.steps >= 0, "steps", "at least 0 (0: one epoch)", static_cast<double>(c.steps)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.num_generations >= 2 && c.num_generations <= dc::kMaxReturnSequences,
                                      "num_generations", "in [2, 1024]", static_cast<double>(c.num_generations)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.prompts_per_round >= 1 && c.prompts_per_round <= 4096, "prompts_per_round",
                                      "in [1, 4096]", static_cast<double>(c.prompts_per_round)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.grad_accum >= 1 && c.grad_accum <= 4096, "grad_accum", "in [1, 4096]",
                                      static_cast<double>(c.grad_accum)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.num_iterations >= 1 && c.num_iterations <= 1024, "num_iterations",
                                      "in [1, 1024]", static_cast<double>(c.num_iterations)));
  if (c.precision != "bf16" && c.precision != "f32")
    return dc::invalid_argument("precision: \"bf16\" or \"f32\", got \"" + c.precision + "\"");
  if (c.lr_schedule != "constant" && c.lr_schedule != "linear" && c.lr_schedule != "cosine")
    return dc::invalid_argument("lr_schedule: \"constant\", \"linear\" or \"cosine\", got \"" + c.lr_schedule + "\"");
  DC_RETURN_IF_ERROR(dc::api::check_optimizer_fields(
      {c.lr, c.min_lr_ratio, c.weight_decay, c.max_grad_norm, c.beta1, c.beta2, c.adam_eps}));
  DC_RETURN_IF_ERROR(check_grpo_range(c.warmup_ratio >= 0 && c.warmup_ratio <= 1, "warmup_ratio", "in [0, 1]", c.warmup_ratio));
  DC_RETURN_IF_ERROR(check_grpo_range(c.beta >= 0 && c.beta <= 1e6, "beta", "in [0, 1e6]", c.beta));
  DC_RETURN_IF_ERROR(check_grpo_range(c.epsilon >= 0 && c.epsilon <= 1, "epsilon", "in [0, 1]", c.epsilon));
  DC_RETURN_IF_ERROR(check_grpo_range(c.ref_sync_steps >= 0, "ref_sync_steps", "at least 0 (0: never)",
                                      static_cast<double>(c.ref_sync_steps)));
  DC_RETURN_IF_ERROR(check_grpo_range(c.ref_mixup_alpha >= 0 && c.ref_mixup_alpha <= 1, "ref_mixup_alpha", "in [0, 1]",
                                      c.ref_mixup_alpha));
  DC_RETURN_IF_ERROR(check_grpo_range(c.save_every >= 0, "save_every", "at least 0 (0: only save())",
                                      static_cast<double>(c.save_every)));
  return check_grpo_rollout_fields(c);
}

// The optimizer loop's options of `c` (n_prompts and the steps of an epoch filled in by create).
dc::Result<dc::train::GrpoOptions> grpo_options(const GrpoConfig& c) {
  dc::train::GrpoOptions o;
  o.model_dir = c.model_dir, o.out_dir = c.out_dir;
  o.steps = c.steps, o.group_size = c.num_generations, o.prompts_per_round = c.prompts_per_round;
  o.grad_accum = c.grad_accum, o.num_iterations = c.num_iterations;
  o.random_masking = c.random_masking, o.scale_rewards = c.scale_rewards;
  o.loss.beta = c.beta, o.loss.epsilon = c.epsilon;
  o.ref_sync_steps = c.ref_sync_steps, o.ref_mixup_alpha = c.ref_mixup_alpha;
  DC_ASSIGN_OR_RETURN(o.lr.schedule, dc::train::parse_lr_schedule(c.lr_schedule));
  o.lr.lr = c.lr, o.lr.min_lr_ratio = c.min_lr_ratio, o.warmup_ratio = c.warmup_ratio;
  o.adam.beta1 = c.beta1, o.adam.beta2 = c.beta2, o.adam.eps = c.adam_eps, o.adam.weight_decay = c.weight_decay;
  o.max_grad_norm = c.max_grad_norm;
  o.seed = c.seed, o.recompute = c.grad_checkpointing;
  o.max_prompt_length = c.max_prompt_length, o.max_completion_length = c.max_completion_length, o.rollout_kv_cache = c.fast;
  o.precision = c.precision == "f32" ? dc::MatmulPrecision::kF32 : dc::MatmulPrecision::kBF16;
  DC_ASSIGN_OR_RETURN(o.lora, dc::api::lora_spec(c.lora_r, c.lora_alpha, c.lora_targets, c.lora_dropout));
  o.save_every = c.save_every;
  o.resume = c.resume, o.force = c.force;
  return o;
}

dc::train::RewardOptions reward_options(const GrpoConfig& c) {
  dc::train::RewardOptions r;
  r.code_weight = c.code_weight, r.format_weight = c.format_weight, r.user_weight = c.reward_weight;
  r.code.timeout_seconds = c.test_timeout, r.code.workers = c.reward_workers;
  r.code.memory_bytes = c.test_memory_bytes, r.code.max_processes = c.test_max_processes;
  r.user.argv = c.reward_program;
  return r;
}

// The rollouts' decoding: the recipe's (train/rollout.h) with the config's lengths, steps and sampling.
dc::train::RolloutOptions rollout_options(const GrpoConfig& c, const dc::ModelConfig& config, const dc::Tokenizer& tokenizer) {
  dc::train::RolloutOptions ro;
  ro.group_size = c.num_generations;
  ro.sampling = dc::train::recipe_rollout_params(config);
  ro.sampling.max_new_tokens = c.max_completion_length;
  ro.sampling.steps = c.diffusion_steps;
  ro.sampling.temperature = c.temperature;
  ro.sampling.top_p = c.temperature > 0 ? c.top_p : 1.0f;  // the reference: top_p only when sampling
  if (c.fast) dc::apply_fast_mode(ro.sampling);
  if (const auto im_end = tokenizer.token_to_id("<|im_end|>")) ro.im_end_id = *im_end;
  return ro;
}

// The mean and population std of the finite `scores`.
GrpoRewardStats reward_stats(std::string name, const std::vector<double>& scores) {
  GrpoRewardStats r;
  r.name = std::move(name);
  double sum = 0, sum_sq = 0;
  for (double x : scores)
    if (std::isfinite(x)) sum += x, ++r.n;
  if (r.n == 0) return r;
  r.mean = sum / static_cast<double>(r.n);
  for (double x : scores)
    if (std::isfinite(x)) sum_sq += (x - r.mean) * (x - r.mean);
  r.std = std::sqrt(sum_sq / static_cast<double>(r.n));
  return r;
}

// Every reward that is on in `rw`, unweighted.
std::vector<GrpoRewardStats> rewards_of(const dc::train::RewardBatch& rw) {
  std::vector<GrpoRewardStats> out;
  if (!rw.code.empty()) {
    std::vector<double> code;
    for (const dc::train::CodeResult& c : rw.code) code.push_back(c.reward);
    out.push_back(reward_stats("code", code));
  }
  if (!rw.code_format.empty()) out.push_back(reward_stats("code_format", rw.code_format));
  if (!rw.user.empty()) out.push_back(reward_stats("reward_program", rw.user));
  return out;
}

// How a round's rollouts are cut and scored: prompts per generation (0: all of the rank's at once) and whether
// the rewards of a chunk are scored on a worker thread while the next chunk is generated and the trainer
// computes the round's log-probs (the same scores either way).
struct RolloutPlan {
  int64_t chunk_prompts = 0;
  bool overlap = true;
};

// One round's rollouts of this rank's prompts: generated from the policy chunk by chunk (chunk c of round r
// seeded by (seed, r, c)), each chunk's completions handed to a RewardScorer as soon as they exist, laid out
// as the trainer's batch (with the prompts' padding mask); the scores come through Rollout::await_rewards,
// with each reward's statistics into *round_rewards.
dc::train::RolloutFn make_rollout_fn(const dc::train::GrpoDataset& ds, const dc::Tokenizer& tok,
                                     const dc::train::RolloutOptions& ro, uint64_t seed,
                                     const dc::train::RewardOptions& rewards, RolloutPlan plan,
                                     std::vector<GrpoRewardStats>* round_rewards) {
  return [&ds, &tok, ro, seed, rewards, plan, round_rewards](
             const dc::Context& ctx, const dc::Model& policy, int64_t round,
             const std::vector<int64_t>& prompts) -> dc::Result<dc::train::Rollout> {
    auto scorer = std::make_shared<dc::train::RewardScorer>(rewards, plan.overlap);
    const size_t n = prompts.size();
    const size_t per = plan.chunk_prompts > 0 ? std::min(n, static_cast<size_t>(plan.chunk_prompts)) : n;
    dc::train::RolloutBatch rb;
    for (size_t begin = 0; begin < n; begin += per) {
      const size_t end = std::min(n, begin + per);
      std::vector<std::vector<int32_t>> ids;
      std::vector<const dc::train::GrpoExample*> examples;
      for (size_t i = begin; i < end; ++i)
        ids.push_back(ds.examples[prompts[i]].prompt_ids), examples.push_back(&ds.examples[prompts[i]]);
      DC_ASSIGN_OR_RETURN(dc::train::RolloutBatch chunk,
                          dc::train::generate_rollouts(ctx, policy, tok, ids, ro,
                                                       dc::train::hash_counters(seed, 0x726f6c6c, round, begin / per)));
      DC_ASSIGN_OR_RETURN(std::vector<dc::train::RewardInput> inputs, dc::train::reward_inputs(chunk, examples));
      DC_RETURN_IF_ERROR(scorer->submit(std::move(inputs), "round " + std::to_string(round) + "'s completions of its prompts " +
                                                               std::to_string(begin) + "-" + std::to_string(end - 1)));
      DC_RETURN_IF_ERROR(dc::train::append_rollouts(rb, std::move(chunk), ro.sampling.pad_token_id));
    }
    dc::train::Rollout r;
    r.batch.n_batch = rb.n_rows, r.batch.n_prompt = rb.prompt_width, r.batch.n_completion = rb.completion_length;
    r.batch.prompt_ids = std::move(rb.prompt_ids);
    r.batch.prompt_mask = std::move(rb.prompt_mask);  // the scoring forward masks the pads as the rollout did
    r.batch.completion_ids = std::move(rb.completion_ids);
    r.batch.completion_mask = std::move(rb.completion_mask);
    r.await_rewards = [scorer, round_rewards, tokens_per_second = rb.tokens_per_second(),
                       generate_seconds = rb.seconds](dc::train::Rollout& r) -> dc::Status {
      DC_ASSIGN_OR_RETURN(dc::train::RewardBatch rw, scorer->finish());
      *round_rewards = rewards_of(rw);
      r.rewards = rw.total;
      r.metrics = {{"pass_rate", rw.pass_rate()},
                   {"format_rate", rw.format_rate()},
                   {"rollout_tokens_per_s", tokens_per_second},
                   {"generate_seconds", generate_seconds},
                   {"reward_seconds", rw.seconds},
                   {"reward_wait_seconds", scorer->wait_seconds()}};
      return dc::Status();
    };
    return r;
  };
}

GrpoStepStats to_public_grpo_stats(const dc::train::GrpoStepStats& s) {
  GrpoStepStats p;
  p.step = s.step, p.round = s.round, p.iteration = s.iteration;
  p.loss = s.loss, p.kl = s.kl, p.clip_fraction = s.clip_fraction, p.grad_norm = s.grad_norm, p.lr = s.lr;
  p.reward_mean = s.reward_mean, p.reward_std = s.reward_std, p.metrics = s.metrics;
  p.rollout_tokens = s.rollout_tokens, p.rollout_seconds = s.rollout_seconds, p.score_seconds = s.score_seconds;
  p.train_seconds = s.train_seconds, p.seconds = s.seconds, p.skipped = s.skipped, p.skip_note = s.skip_note;
  return p;
}

}  // namespace

Status check_grpo_config(const GrpoConfig& config) {
  return dc::api::to_public([&]() -> dc::Status {
    DC_RETURN_IF_ERROR(check_grpo_fields(config));
    return dc::api::lora_spec(config.lora_r, config.lora_alpha, config.lora_targets, config.lora_dropout).status();
  }());
}

GrpoTrainer::GrpoTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpoTrainer::~GrpoTrainer() = default;

Result<std::unique_ptr<GrpoTrainer>> GrpoTrainer::create(const GrpoConfig& c) {
  return dc::api::to_public([&]() -> dc::Result<std::unique_ptr<GrpoTrainer>> {
    DC_RETURN_IF_ERROR(check_grpo_fields(c));
    DC_ASSIGN_OR_RETURN(dc::train::GrpoOptions o, grpo_options(c));
    auto impl = std::make_unique<Impl>();
    if (c.ranks != nullptr && c.ranks->size() > 1) impl->comm = c.ranks->impl_->comm.get();
    o.comm = impl->comm;
    const dc::train::RewardOptions rewards = reward_options(c);
    impl->sandboxed = rewards.code_weight != 0 || rewards.format_weight != 0;
    DC_ASSIGN_OR_RETURN(impl->tokenizer, dc::model_source_tokenizer(c.model_dir));
    dc::train::GrpoDataOptions d;
    d.max_prompt_length = c.max_prompt_length;
    d.require_tests = impl->sandboxed;
    DC_ASSIGN_OR_RETURN(impl->data, dc::train::load_grpo_dataset(c.data_path, *impl->tokenizer, d));
    DC_ASSIGN_OR_RETURN(const dc::ModelConfig config, dc::model_source_config(c.model_dir));
    const dc::train::RolloutOptions ro = rollout_options(c, config, *impl->tokenizer);
    o.n_prompts = static_cast<int64_t>(impl->data.examples.size());
    if (o.steps == 0) {  // one epoch: every prompt once
      const int64_t rounds = (o.n_prompts + o.prompts_per_round - 1) / o.prompts_per_round;
      o.steps = rounds * o.num_iterations;
    }
    impl->steps = o.steps;
    impl->lora_targets = o.lora.r > 0 ? dc::lora_targets_text(o.lora.targets) : "";
    const uint64_t seed = o.seed + static_cast<uint64_t>(impl->comm != nullptr ? impl->comm->rank() : 0);  // each rank its own completions
    impl->pool = std::make_unique<dc::ThreadPool>(c.threads);
    dc::Context ctx;
    ctx.pool = impl->pool.get();
    DC_RETURN_IF_ERROR(dc::api::open_rank_device(c.device, impl->comm, &impl->backend, &ctx));
    DC_ASSIGN_OR_RETURN(impl->trainer, dc::train::GrpoTrainer::create(
                                           o, ctx, make_rollout_fn(impl->data, *impl->tokenizer, ro, seed, rewards,
                                                                {c.generation_batch_size / c.num_generations, c.overlap_rewards},
                                                                &impl->round_rewards)));
    return std::unique_ptr<GrpoTrainer>(new GrpoTrainer(std::move(impl)));
  }());
}

Result<GrpoStepStats> GrpoTrainer::step() {
  dc::Result<dc::train::GrpoStepStats> r = impl_->trainer->step();
  if (!r.ok()) return dc::api::to_public(r.status());
  ++impl_->steps_here;
  GrpoStepStats stats = to_public_grpo_stats(*r);
  stats.rewards = impl_->round_rewards;
  return stats;
}

Status GrpoTrainer::save() { return dc::api::to_public(impl_->trainer->save()); }
int64_t GrpoTrainer::steps_done() const { return impl_->trainer->steps_done(); }
int64_t GrpoTrainer::steps() const { return impl_->steps; }
std::string GrpoTrainer::precision() const {
  return impl_->trainer->precision() == dc::MatmulPrecision::kBF16 ? "bf16" : "f32";
}
int64_t GrpoTrainer::prompts() const { return static_cast<int64_t>(impl_->data.examples.size()); }
int64_t GrpoTrainer::truncated_prompts() const { return impl_->data.n_truncated; }
std::string GrpoTrainer::device() const { return impl_->backend != nullptr ? impl_->backend->name() : "cpu"; }
std::string GrpoTrainer::lora_targets() const { return impl_->lora_targets; }
std::string GrpoTrainer::sandbox_note() const { return impl_->sandboxed ? dc::sandbox::describe() : ""; }
int64_t GrpoTrainer::skipped_steps() const { return impl_->trainer->footprint().skipped_steps; }

std::vector<GrpoStepStats> GrpoTrainer::history() const {
  std::vector<GrpoStepStats> out;
  out.reserve(impl_->trainer->history().size());
  for (const dc::train::GrpoStepStats& s : impl_->trainer->history()) out.push_back(to_public_grpo_stats(s));
  return out;
}

Result<std::vector<TrainRankStats>> GrpoTrainer::gather_rank_stats() {
  return dc::api::to_public(dc::api::gather_rank_stats(impl_->comm, impl_->trainer->footprint(), impl_->steps_here));
}

}  // namespace diffucoder
