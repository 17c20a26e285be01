// Coupled-GRPO rollouts: one generation of G completions per prompt, cut into the loss's and the rewards'
// views (ids, completion mask, text).
#include "train/rollout.h"

#include <algorithm>
#include <chrono>
#include <iterator>

#include "engine/engine.h"

namespace dc::train {

SamplingParams recipe_rollout_params(const ModelConfig& config) {
  SamplingParams p;
  p.max_new_tokens = 256;
  p.steps = 256;
  p.eps = 1e-3f;
  p.alg = Algorithm::kEntropy;
  p.alg_temp = 0.0f;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.top_k = 50;
  p.mask_token_id = static_cast<int32_t>(config.mask_token_id);
  p.pad_token_id = static_cast<int32_t>(config.pad_token_id >= 0 ? config.pad_token_id : config.eos_token_id);
  p.max_position_embeddings = config.max_position_embeddings;
  return p;
}

double RolloutBatch::tokens_per_second() const {
  return seconds > 0 ? static_cast<double>(n_rows * completion_length) / seconds : 0.0;
}

std::vector<uint8_t> completion_mask(std::span<const int32_t> completion, int32_t im_end_id) {
  std::vector<uint8_t> mask(completion.size(), 1);
  if (im_end_id < 0) return mask;
  for (size_t i = 0; i < completion.size(); ++i)
    if (completion[i] == im_end_id) {
      std::fill(mask.begin() + static_cast<std::ptrdiff_t>(i) + 1, mask.end(), 0);
      break;
    }
  return mask;
}

Result<std::string> completion_text(const Tokenizer& tokenizer, std::span<const int32_t> completion) {
  std::vector<int32_t> ids;
  ids.reserve(completion.size());
  for (int32_t id : completion)
    if (id >= 0 && id < tokenizer.vocab_size()) ids.push_back(id);
  return tokenizer.decode(ids, /*skip_special_tokens=*/true);
}

Result<RolloutBatch> generate_rollouts(const Context& ctx, const Model& policy, const Tokenizer& tokenizer,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       const RolloutOptions& options, uint64_t seed, const GenerateHooks& hooks) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.group_size < 1 || options.group_size > kMaxReturnSequences)
    return invalid_argument("group_size (completions per prompt): must be in [1, " +
                            std::to_string(kMaxReturnSequences) + "], got " + std::to_string(options.group_size));
  SamplingParams params = options.sampling;
  params.num_return_sequences = static_cast<int>(options.group_size);
  params.seed = seed;
  GenerateHooks h = hooks;
  h.pool = ctx.pool;
  DC_ASSIGN_OR_RETURN(GenerateOutput out, generate_on_model(policy, ctx, EngineOptions::kDefaultMaxKvCacheBytes,
                                                            prompts, params, std::move(h)));
  RolloutBatch b;
  b.n_prompts = static_cast<int64_t>(prompts.size());
  b.group_size = options.group_size;
  b.n_rows = out.n_rows;
  b.prompt_width = out.prompt_width;
  b.completion_length = out.n_seq - out.prompt_width;
  const auto P = static_cast<size_t>(b.prompt_width);
  b.prompt_ids.reserve(b.n_rows * P);
  b.prompt_mask.reserve(b.n_rows * P);
  b.completion_ids.reserve(b.n_rows * b.completion_length);
  b.completion_mask.reserve(b.n_rows * b.completion_length);
  b.texts.reserve(b.n_rows);
  for (int64_t r = 0; r < b.n_rows; ++r) {
    const std::vector<int32_t>& seq = out.sequences[r];
    b.prompt_ids.insert(b.prompt_ids.end(), seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(P));
    const auto pads = static_cast<size_t>(out.pad_counts[r]);
    b.prompt_mask.insert(b.prompt_mask.end(), pads, 0);
    b.prompt_mask.insert(b.prompt_mask.end(), P - pads, 1);
    const std::vector<int32_t>& gen = out.generated[r];
    b.completion_ids.insert(b.completion_ids.end(), gen.begin(), gen.end());
    const std::vector<uint8_t> mask = completion_mask(gen, options.im_end_id);
    b.completion_mask.insert(b.completion_mask.end(), mask.begin(), mask.end());
    DC_ASSIGN_OR_RETURN(std::string text, completion_text(tokenizer, gen));
    b.texts.push_back(std::move(text));
  }
  b.timings = out.timings;
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

namespace {

// [rows, width] → [rows, new_width] (new_width >= width), `pad` added on the left of each row.
template <typename T>
void widen_left(std::vector<T>& v, int64_t rows, int64_t width, int64_t new_width, T pad) {
  if (new_width == width) return;
  std::vector<T> out(static_cast<size_t>(rows * new_width), pad);
  for (int64_t r = 0; r < rows; ++r)
    std::copy(v.begin() + r * width, v.begin() + (r + 1) * width, out.begin() + r * new_width + (new_width - width));
  v = std::move(out);
}

}  // namespace

Status append_rollouts(RolloutBatch& into, RolloutBatch chunk, int32_t pad_id) {
  if (into.n_rows == 0) {
    into = std::move(chunk);
    return Status();
  }
  if (chunk.group_size != into.group_size || chunk.completion_length != into.completion_length)
    return invalid_argument("append_rollouts: a chunk of " + std::to_string(chunk.group_size) + " completions of " +
                            std::to_string(chunk.completion_length) + " tokens after " + std::to_string(into.group_size) +
                            " of " + std::to_string(into.completion_length));
  const int64_t width = std::max(into.prompt_width, chunk.prompt_width);
  widen_left(into.prompt_ids, into.n_rows, into.prompt_width, width, pad_id);
  widen_left(into.prompt_mask, into.n_rows, into.prompt_width, width, uint8_t{0});
  widen_left(chunk.prompt_ids, chunk.n_rows, chunk.prompt_width, width, pad_id);
  widen_left(chunk.prompt_mask, chunk.n_rows, chunk.prompt_width, width, uint8_t{0});
  auto append = [](auto& a, auto& b) { a.insert(a.end(), std::make_move_iterator(b.begin()), std::make_move_iterator(b.end())); };
  append(into.prompt_ids, chunk.prompt_ids);
  append(into.prompt_mask, chunk.prompt_mask);
  append(into.completion_ids, chunk.completion_ids);
  append(into.completion_mask, chunk.completion_mask);
  append(into.texts, chunk.texts);
  into.n_prompts += chunk.n_prompts, into.n_rows += chunk.n_rows, into.prompt_width = width;
  GenerateTimings& t = into.timings;
  const GenerateTimings& c = chunk.timings;
  t.total_ms += c.total_ms, t.forward_ms += c.forward_ms, t.sampling_ms += c.sampling_ms, t.steps_run += c.steps_run;
  t.forwards += c.forwards, t.cache_refreshes += c.cache_refreshes, t.positions_computed += c.positions_computed;
  into.seconds += chunk.seconds;
  return Status();
}

}  // namespace dc::train
