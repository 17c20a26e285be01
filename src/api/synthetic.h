// The facade's synthetic models (LoadOptions::synthetic, TrainConfig::synthetic): a SyntheticModel's fields
// checked by name and turned into a named shape's config and its random weights (model/synthetic.h).
#pragma once

#include <diffucoder/diffucoder.h>

#include <memory>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/transformer.h"

namespace dc::api {

// The config of s.shape with s.layers / s.vocab applied (a smaller vocabulary's last two ids the mask and the
// pad / end token). invalid_argument naming the field; an unknown shape's error is model/'s, which names bench's
// --shape flag and lists the shapes.
Result<ModelConfig> synthetic_config(const diffucoder::SyntheticModel& s);

// The model of `config` (synthetic_config's) with s's random weights, drawn on `pool`: bf16, or q8 / q4
// quantized matrix by matrix as drawn (a bad q4 group size: model/'s error, naming bench's --group-size).
Result<std::unique_ptr<Model>> synthetic_model(const diffucoder::SyntheticModel& s, const ModelConfig& config,
                                               ThreadPool* pool);

// The values of every tensor of a model of `config` (what ModelParams holds of it).
int64_t count_values(const ModelConfig& config);

}  // namespace dc::api
