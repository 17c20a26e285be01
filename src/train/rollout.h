// Coupled-GRPO rollouts (spec §4.2): G completions per prompt sampled from the CURRENT policy with the
// diffusion decoder, all prompts of a round in one left-padded batch, and what the loss and the rewards
// read from them: the ids, the completion mask (through the first <|im_end|>) and the decoded text.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "model/transformer.h"
#include "sampler/generate.h"
#include "tokenizer/tokenizer.h"

namespace dc::train {

// The recipe's rollout decoding (spec §3.7 "GRPO rollouts", §4.7): 256 new tokens, 256 steps, alg
// entropy, temperature 1.0, top-p 0.95, top-k 50 (the reference's effective default, §3.2), alg_temp 0,
// eps 1e-3, whole-canvas decoding without a KV cache; mask / pad ids and context length from `config`
// (pad: pad_token_id, else eos_token_id).
SamplingParams recipe_rollout_params(const ModelConfig& config);

struct RolloutOptions {
  int64_t group_size = 10;   // G completions per prompt (num_generations), in [1, kMaxReturnSequences]
  // The decoding; seed and num_return_sequences are set by generate_rollouts. block_length / cache /
  // threshold / factor (e.g. apply_fast_mode) make the rollouts FASTER BUT APPROXIMATE: the completions
  // are then not drawn from the policy's own distribution as the reference's sampler defines it (cached
  // keys / values of other positions, several tokens committed per step); the loss still scores them
  // exactly. Off in the recipe.
  SamplingParams sampling;
  // <|im_end|>: the completion mask ends with its first occurrence; -1 (e.g. a tokenizer without it):
  // every position is 1.
  int32_t im_end_id = -1;
};

// One round of rollouts. Row r = p · group_size + g is completion g of prompt p (prompts in the order
// given; each prompt's G rows are consecutive, as the reference's repeat_interleave).
struct RolloutBatch {
  int64_t n_prompts = 0, group_size = 0;
  int64_t n_rows = 0;                   // n_prompts · group_size
  int64_t prompt_width = 0;             // the longest prompt; shorter ones are left-padded to it
  int64_t completion_length = 0;        // new tokens per row (the canvas after the prompt)
  std::vector<int32_t> prompt_ids;      // [n_rows, prompt_width] left pads (sampling.pad_token_id), prompt
  std::vector<uint8_t> prompt_mask;     // [n_rows, prompt_width] 1 = a prompt token, 0 = a pad (the loss's
                                        // GrpoBatch::prompt_mask: scored with the decoder's mask / positions)
  std::vector<int32_t> completion_ids;  // [n_rows, completion_length] every generated id
  std::vector<uint8_t> completion_mask; // [n_rows, completion_length] 1 through the first <|im_end|>, 0 after
  std::vector<std::string> texts;       // [n_rows] completion_text of each row
  GenerateTimings timings;              // of the decoding (forward / sampling split)
  double seconds = 0;                   // wall time of generate_rollouts
  // Generated canvas positions (n_rows · completion_length) per second of `seconds`.
  double tokens_per_second() const;
};

// completion_mask of one completion (spec §4.2): 1 up to and including the first `im_end_id`, 0 after;
// all ones when it does not occur or im_end_id < 0. [completion.size()]
std::vector<uint8_t> completion_mask(std::span<const int32_t> completion, int32_t im_end_id);

// The reward text of one completion (spec §4.2): every id decoded with special tokens skipped
// (<|im_end|>, <|dlm_pad|>, <|mask|>, … left out; ordinary text after <|im_end|> kept), ids the tokenizer
// does not have (the embedding has more rows) dropped as Hugging Face's decode does.
Result<std::string> completion_text(const Tokenizer& tokenizer, std::span<const int32_t> completion);

// Samples options.group_size completions of every prompt from `policy` in ONE generation (the prompts
// left-padded to the longest, positions and padding mask as the reference's, spec §3.3), with every
// random draw a function of (seed, step, row, position): the same policy, prompts, options and seed give
// the same rollouts, whatever the thread count. `policy` is any Model, e.g. one viewed over the trainer's
// f32 ModelParams (Model::from_weights(config, params.weights(), nullptr)) or over its bf16 mixed-precision
// copy; ctx supplies the pool (forward and sampling) and the matmul precision; the forward's scratch and
// the KV cache (cache modes, refused past EngineOptions::kDefaultMaxKvCacheBytes) are this call's own.
// hooks.on_step / logits_hook / tokens_hook are passed to the sampler (e.g. progress; hooks.pool is
// replaced by ctx.pool). Errors: no prompt, a prompt empty or with ids outside the vocabulary (naming its
// index), invalid sampling params or sizes past the sampler's limits (sampler/generate.h), a canvas past
// the model's context, out of memory (resource_exhausted), cancellation by on_step.
Result<RolloutBatch> generate_rollouts(const Context& ctx, const Model& policy, const Tokenizer& tokenizer,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       const RolloutOptions& options, uint64_t seed, const GenerateHooks& hooks = {});

// Appends `chunk`'s rows after `into`'s, for a round generated in chunks of prompts: the prompts of both
// left-padded with `pad_id` to the wider of the two (prompt_mask 0 on the pads added, so each completion
// scores as it was generated), the rest concatenated, the timings and seconds added. An empty `into` (no rows)
// becomes `chunk`. invalid_argument when their group sizes or completion lengths differ.
Status append_rollouts(RolloutBatch& into, RolloutBatch chunk, int32_t pad_id);

}  // namespace dc::train
