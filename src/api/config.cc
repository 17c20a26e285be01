// The public GenerationConfig <-> SamplingParams, check_config and resolve_fast (api/config.h).
#include "api/config.h"

#include "api/status_convert.h"

namespace dc::api {

Result<SamplingParams> sampling_params(SamplingParams p, const diffucoder::GenerationConfig& c) {
  p.max_new_tokens = c.max_new_tokens;
  p.max_length = c.max_length;
  p.steps = c.steps;
  p.eps = c.eps;
  DC_ASSIGN_OR_RETURN(p.alg, parse_algorithm(c.alg));
  p.alg_temp = c.alg_temp;
  p.temperature = c.temperature;
  p.top_p = c.top_p;
  p.top_k = c.top_k;
  p.num_return_sequences = c.num_return_sequences;
  p.seed = c.seed;
  p.output_history = c.output_history;
  if (c.mask_token_id) p.mask_token_id = *c.mask_token_id;
  if (c.pad_token_id) p.pad_token_id = *c.pad_token_id;
  p.block_length = c.block_length;
  DC_ASSIGN_OR_RETURN(p.cache, parse_cache_mode(c.cache));
  p.refresh_every = c.refresh_every;
  p.threshold = c.threshold;
  p.factor = c.factor;
  if (c.fast) apply_fast_mode(p);
  return p;
}

diffucoder::GenerationConfig generation_config(const SamplingParams& p) {
  diffucoder::GenerationConfig c;
  c.max_new_tokens = p.max_new_tokens;
  c.max_length = p.max_length;
  c.steps = p.steps;
  c.eps = p.eps;
  c.alg = algorithm_name(p.alg);
  c.alg_temp = p.alg_temp;
  c.temperature = p.temperature;
  c.top_p = p.top_p;
  c.top_k = p.top_k;
  c.num_return_sequences = p.num_return_sequences;
  c.seed = p.seed;
  c.output_history = p.output_history;
  c.mask_token_id = p.mask_token_id;
  c.pad_token_id = p.pad_token_id;
  c.block_length = p.block_length;
  c.cache = cache_mode_name(p.cache);
  c.refresh_every = p.refresh_every;
  c.threshold = p.threshold;
  c.factor = p.factor;
  return c;
}

}  // namespace dc::api

namespace diffucoder {

using dc::api::sampling_params;
using dc::api::to_public;

Status check_config(const GenerationConfig& config) {
  return to_public([&]() -> dc::Status {
    dc::SamplingParams placeholder;  // ids that any vocabulary holds; the real ones are checked by generate()
    placeholder.mask_token_id = 0;
    placeholder.pad_token_id = 1;
    DC_ASSIGN_OR_RETURN(dc::SamplingParams p, sampling_params(placeholder, config));
    DC_RETURN_IF_ERROR(dc::validate(p, INT32_MAX));
    return config.max_new_tokens ? dc::check_steps_per_block(p, *config.max_new_tokens) : dc::Status::ok_status();
  }());
}

Result<GenerationConfig> resolve_fast(const GenerationConfig& config) {
  if (!config.fast) return config;
  return to_public([&]() -> dc::Result<GenerationConfig> {
    dc::SamplingParams p;  // sampling_params applies fast's defaults; the ids are config's again below
    DC_ASSIGN_OR_RETURN(p, sampling_params(p, config));
    GenerationConfig resolved = dc::api::generation_config(p);
    resolved.mask_token_id = config.mask_token_id;
    resolved.pad_token_id = config.pad_token_id;
    return resolved;
  }());
}

}  // namespace diffucoder
