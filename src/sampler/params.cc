// SamplingParams: algorithm names, validation with field-naming messages, the canvas-length rules,
// and post-processing of generated ids.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/number_text.h"
#include "sampler/generate.h"

namespace dc {

Result<Algorithm> parse_algorithm(std::string_view name) {
  for (Algorithm alg : {Algorithm::kOrigin, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy}) {
    if (name == algorithm_name(alg)) return alg;
  }
  return invalid_argument("alg: unknown algorithm '" + std::string(name) +
                          "'; valid names are origin, maskgit_plus, topk_margin, entropy");
}

const char* algorithm_name(Algorithm alg) {
  switch (alg) {
    case Algorithm::kOrigin: return "origin";
    case Algorithm::kMaskgitPlus: return "maskgit_plus";
    case Algorithm::kTopkMargin: return "topk_margin";
    case Algorithm::kEntropy: return "entropy";
  }
  return "unknown";
}

Result<CacheMode> parse_cache_mode(std::string_view name) {
  for (CacheMode mode : {CacheMode::kNone, CacheMode::kPrefix, CacheMode::kDual, CacheMode::kCommitted}) {
    if (name == cache_mode_name(mode)) return mode;
  }
  return invalid_argument("cache: unknown cache mode '" + std::string(name) +
                          "'; valid names are none, prefix, dual, committed");
}

const char* cache_mode_name(CacheMode mode) {
  switch (mode) {
    case CacheMode::kNone: return "none";
    case CacheMode::kPrefix: return "prefix";
    case CacheMode::kDual: return "dual";
    case CacheMode::kCommitted: return "committed";
  }
  return "unknown";
}

Status validate(const SamplingParams& p, int64_t n_vocab) {
  if (n_vocab < 1) return invalid_argument("n_vocab: must be >= 1 (got " + std::to_string(n_vocab) + ")");
  if (p.steps < 1) return invalid_argument("steps: must be >= 1 (got " + std::to_string(p.steps) + ")");
  if (p.steps > kMaxSteps) {
    return invalid_argument("steps: must be <= " + std::to_string(kMaxSteps) + " (got " + std::to_string(p.steps) +
                            "); more steps than new tokens only adds steps that commit nothing");
  }
  if (!(p.eps > 0.0f && p.eps < 1.0f)) {
    return invalid_argument("eps: must be in (0, 1) (got " + number_text(p.eps, 6) + "); the reference uses 1e-3");
  }
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return invalid_argument("temperature: must be finite and >= 0 (got " + number_text(p.temperature, 6) + "); 0 = greedy");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return invalid_argument("top_p: must be in (0, 1] (got " + number_text(p.top_p, 6) + "); 1 disables top-p");
  }
  if (!(p.alg_temp >= 0.0f) || !std::isfinite(p.alg_temp)) {
    return invalid_argument("alg_temp: must be finite and >= 0 (got " + number_text(p.alg_temp, 6) + "); 0 = deterministic top-k");
  }
  if (p.num_return_sequences < 1) {
    return invalid_argument("num_return_sequences: must be >= 1 (got " + std::to_string(p.num_return_sequences) + ")");
  }
  if (p.num_return_sequences > kMaxReturnSequences) {
    return invalid_argument("num_return_sequences: must be <= " + std::to_string(kMaxReturnSequences) + " (got " +
                            std::to_string(p.num_return_sequences) + ")");
  }
  if (p.max_new_tokens && (*p.max_new_tokens < 1 || *p.max_new_tokens > kMaxCanvasLength)) {
    return invalid_argument("max_new_tokens: must be in [1, " + std::to_string(kMaxCanvasLength) + "] (got " +
                            std::to_string(*p.max_new_tokens) + "); the model's context is the tighter limit");
  }
  if (p.max_length && (*p.max_length < 1 || *p.max_length > kMaxCanvasLength)) {
    return invalid_argument("max_length: must be in [1, " + std::to_string(kMaxCanvasLength) + "] (got " +
                            std::to_string(*p.max_length) + "); the model's context is the tighter limit");
  }
  if (p.max_position_embeddings < 0) {
    return invalid_argument("max_position_embeddings: must be >= 0 (got " + std::to_string(p.max_position_embeddings) +
                            "); 0 = no cap");
  }
  if (p.mask_token_id < 0 || p.mask_token_id >= n_vocab) {
    return invalid_argument("mask_token_id: " + std::to_string(p.mask_token_id) + " is outside [0, " +
                            std::to_string(n_vocab) + ")");
  }
  if (p.pad_token_id < 0 || p.pad_token_id >= n_vocab) {
    return invalid_argument("pad_token_id: " + std::to_string(p.pad_token_id) + " is outside [0, " +
                            std::to_string(n_vocab) + ")");
  }
  if (p.block_length < 0) {
    return invalid_argument("block_length: must be >= 0 (got " + std::to_string(p.block_length) +
                            "); 0 = no block decoding, Fast-dLLM uses 32");
  }
  if (p.refresh_every < 1 || p.refresh_every > kMaxSteps) {
    return invalid_argument("refresh_every: must be in [1, " + std::to_string(kMaxSteps) + "] (got " +
                            std::to_string(p.refresh_every) + "); 1 = recompute the whole block every step (= dual), " +
                            "dKV-Cache reloads every 4");
  }
  if (!std::isfinite(p.threshold)) {
    return invalid_argument("threshold: must be finite (got " + number_text(p.threshold, 6) + "); <= 0 = off, Fast-dLLM uses 0.9");
  }
  if (!std::isfinite(p.factor)) {
    return invalid_argument("factor: must be finite (got " + number_text(p.factor, 6) + "); <= 0 = off");
  }
  if (p.threshold > 0.0f && p.factor > 0.0f) {
    return invalid_argument("threshold and factor: at most one of them may be on (got threshold " + number_text(p.threshold, 6) +
                            ", factor " + number_text(p.factor, 6) + ")");
  }
  if (p.pad_token_id == p.mask_token_id) {
    return invalid_argument("pad_token_id: must differ from mask_token_id (" + std::to_string(p.mask_token_id) +
                            "), or left pads would be generated over");
  }
  return Status::ok_status();
}

Result<int64_t> canvas_length(const SamplingParams& p, int64_t prompt_width) {
  int64_t total = 0;
  const char* field = "max_new_tokens";
  if (p.max_new_tokens) {
    if (__builtin_add_overflow(prompt_width, *p.max_new_tokens, &total))
      return invalid_argument("max_new_tokens: " + std::to_string(*p.max_new_tokens) + " is too large");
  } else if (p.max_length) {
    total = *p.max_length;
    field = "max_length";
  } else {
    total = prompt_width + 20;
    if (p.max_position_embeddings > 0) total = std::min(total, p.max_position_embeddings);
    field = "max_position_embeddings";
  }
  if (total <= prompt_width) {
    return invalid_argument(std::string(field) + ": the canvas length " + std::to_string(total) +
                            " must exceed the prompt length " + std::to_string(prompt_width) +
                            "; set max_new_tokens");
  }
  return total;
}

Result<int64_t> canvas_length_in_context(const SamplingParams& p, int64_t prompt_width, int64_t context) {
  DC_ASSIGN_OR_RETURN(int64_t length, canvas_length(p, prompt_width));
  if (length > context)
    return out_of_range("the prompt (" + std::to_string(prompt_width) + " tokens) plus the new tokens make " +
                        std::to_string(length) + " positions, more than the model's context of " +
                        std::to_string(context) + " (max_position_embeddings); shorten the prompt or ask for fewer "
                        "new tokens");
  return length;
}

Status check_steps_per_block(const SamplingParams& p, int64_t new_tokens) {
  if (parallel_decoding(p) || p.block_length <= 0 || new_tokens <= 0) return Status::ok_status();
  const int64_t n_blocks = (new_tokens + p.block_length - 1) / p.block_length;
  if (p.steps < n_blocks) {
    return invalid_argument("steps: block decoding needs at least one step per block: " + std::to_string(new_tokens) +
                            " new tokens in blocks of " + std::to_string(p.block_length) + " make " +
                            std::to_string(n_blocks) + " blocks, but steps is " + std::to_string(p.steps));
  }
  return Status::ok_status();
}

Status check_prompt_ids(std::span<const int32_t> ids, int64_t n_vocab, const std::string& name) {
  for (size_t j = 0; j < ids.size(); ++j) {
    if (ids[j] < 0 || ids[j] >= n_vocab) {
      return invalid_argument(name + ": token id " + std::to_string(ids[j]) + " at index " + std::to_string(j) +
                              " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    }
  }
  return Status::ok_status();
}

std::vector<int32_t> truncate_at_stop(const std::vector<int32_t>& generated, const std::vector<int32_t>& stop_ids) {
  auto it = std::find_first_of(generated.begin(), generated.end(), stop_ids.begin(), stop_ids.end());
  return std::vector<int32_t>(generated.begin(), it);
}

}  // namespace dc
