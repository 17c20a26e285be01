// Matrix products against stored weights. Hugging Face linear weights are [out, in], so the
// product is y = x · Wᵀ ("nt": x not transposed, W transposed).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "ops/weight.h"

namespace dc {

// y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias[w.rows] when bias != nullptr). Overwrites y.
// f32 accumulation over f32 / f16 / bf16 weights; threads over output columns.
void matmul_nt(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* bias, float* y);

}  // namespace dc
