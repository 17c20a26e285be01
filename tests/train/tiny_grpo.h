// The tiny Coupled-GRPO setup the GRPO trainer tests share (grpo_trainer_test.cc, grpo_lora_test.cc, vulkan/*): the
// grpo fixtures' policy, rollouts from the diffusion sampler with a reward on low tokens, short-run options.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "engine/engine.h"
#include "sampler/generate.h"
#include "train/grpo_trainer.h"
#include "train/rollout.h"

namespace dc::train {

inline const std::filesystem::path kGrpoDir = DC_GRPO_FIXTURES_DIR;
inline constexpr int32_t kImEnd = 60;

// The trainer's Rollout of a generation's C-token completions; reward = the share of completion tokens below 32
// (or at or above, `flip`).
inline Rollout scored_rollout(const GenerateOutput& out, int64_t C, bool flip) {
  Rollout r;
  r.batch.n_batch = out.n_rows, r.batch.n_prompt = out.prompt_width, r.batch.n_completion = C;
  double low = 0;
  for (int64_t i = 0; i < out.n_rows; ++i) {
    r.batch.prompt_ids.insert(r.batch.prompt_ids.end(), out.sequences[i].begin(), out.sequences[i].begin() + out.prompt_width);
    r.batch.completion_ids.insert(r.batch.completion_ids.end(), out.generated[i].begin(), out.generated[i].end());
    const std::vector<uint8_t> mask = completion_mask(out.generated[i], kImEnd);
    r.batch.completion_mask.insert(r.batch.completion_mask.end(), mask.begin(), mask.end());
    double n = 0;
    for (int32_t t : out.generated[i]) n += t < 32;
    r.rewards.push_back(flip ? 1.0 - n / C : n / C);
    low += n / C;
  }
  r.metrics = {{"low_token_rate", low / static_cast<double>(out.n_rows)}};
  return r;
}

// The decoding of sampler_rollout and engine_rollout: C new tokens in C steps, entropy order, temperature 1, G
// per prompt, seeded by (seed, round).
inline SamplingParams tiny_rollout_params(const ModelConfig& config, int64_t G, int64_t C, uint64_t seed, int64_t round) {
  SamplingParams sp;
  sp.max_new_tokens = C, sp.steps = static_cast<int>(C), sp.alg = Algorithm::kEntropy, sp.temperature = 1.0f;
  sp.num_return_sequences = static_cast<int>(G);
  sp.seed = seed * 1000003 + static_cast<uint64_t>(round);
  sp.mask_token_id = static_cast<int32_t>(config.mask_token_id);
  sp.pad_token_id = static_cast<int32_t>(config.pad_token_id);
  return sp;
}

// The prompt ids of prompt p: {1 + p % 5, 2, 3}.
inline std::vector<std::vector<int32_t>> tiny_prompts(const std::vector<int64_t>& prompts) {
  std::vector<std::vector<int32_t>> ids;
  for (int64_t p : prompts) ids.push_back({static_cast<int32_t>(1 + p % 5), 2, 3});
  return ids;
}

// Completions of `prompts` by the diffusion sampler over the policy's plain forward (every row's logits to the
// host), G per prompt (scored_rollout's reward).
inline RolloutFn sampler_rollout(int64_t G, int64_t C, uint64_t seed, bool flip) {
  return [=](const Context& ctx, const Model& policy, int64_t round, const std::vector<int64_t>& prompts) -> Result<Rollout> {
    LogitsFn fn = [&](const ForwardBatch& b, float* logits) { return policy.forward(ctx, b, logits); };
    DC_ASSIGN_OR_RETURN(GenerateOutput out, generate(fn, policy.config().n_vocab, tiny_prompts(prompts),
                                                     tiny_rollout_params(policy.config(), G, C, seed, round)));
    return scored_rollout(out, C, flip);
  };
}

// The same completions' decoding the way `grpo` generates its rollouts (train/rollout.h generate_rollouts):
// generate_on_model, whose head samples on the policy's device; with `fast`, --fast's dual KV cache and threshold
// commits (apply_fast_mode) over one block of the C new tokens.
inline RolloutFn engine_rollout(int64_t G, int64_t C, uint64_t seed, bool fast) {
  return [=](const Context& ctx, const Model& policy, int64_t round, const std::vector<int64_t>& prompts) -> Result<Rollout> {
    SamplingParams sp = tiny_rollout_params(policy.config(), G, C, seed, round);
    if (fast) sp.block_length = C, apply_fast_mode(sp);
    DC_ASSIGN_OR_RETURN(GenerateOutput out, generate_on_model(policy, ctx, EngineOptions::kDefaultMaxKvCacheBytes,
                                                              tiny_prompts(prompts), sp));
    return scored_rollout(out, C, false);
  };
}

inline GrpoOptions tiny_grpo_options(int64_t steps) {
  GrpoOptions o;
  o.model_dir = (kGrpoDir / "policy").string();
  o.n_prompts = 5;
  o.steps = steps;
  o.group_size = 8;
  o.prompts_per_round = 2;
  o.grad_accum = 2;
  o.num_iterations = 2;
  o.lr.lr = 3e-3;
  o.lr.schedule = LrSchedule::kConstant;
  o.warmup_ratio = 0;  // else step 0 has rate 0 (Hugging Face warmup)
  o.adam.weight_decay = 0.0;
  o.max_grad_norm = 1.0;
  o.precision = MatmulPrecision::kF32;
  return o;
}

// The mean reward of 64 fresh completions per prompt (another seed than training's).
inline double policy_held_out_reward(const Model& model, const Context& ctx, bool flip) {
  auto r = sampler_rollout(64, 4, 999, flip)(ctx, model, 0, {0, 1, 2, 3, 4});
  EXPECT_TRUE(r.ok()) << r.status().message();
  double sum = 0;
  for (double x : r->rewards) sum += x;
  return sum / static_cast<double>(r->rewards.size());
}

}  // namespace dc::train
