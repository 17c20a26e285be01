// The public GenerationConfig <-> the sampler's SamplingParams, and the facade's checks of a config that need no
// model (check_config, resolve_fast). Apart from the rest of the facade so that what parses configs without an
// engine (the server's request parser and its fuzz target) links only the sampler's parameters.
#pragma once

#include <diffucoder/diffucoder.h>

#include "core/status.h"
#include "sampler/generate.h"

namespace dc::api {

// The sampler's parameters of a facade config over `p` (the engine's defaults); unset ids keep p's.
// invalid_argument naming the field for an unknown alg or cache name (the ranges are dc::validate's).
Result<SamplingParams> sampling_params(SamplingParams p, const diffucoder::GenerationConfig& c);
// The config whose sampling_params over `p` (with p's max_position_embeddings) are `p` again.
diffucoder::GenerationConfig generation_config(const SamplingParams& p);

}  // namespace dc::api
