// Matrix products against stored weights. Hugging Face linear weights are [out, in], so the
// product is y = x · Wᵀ ("nt": x not transposed, W transposed).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "ops/weight.h"

namespace dc {

// y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias[w.rows] when bias != nullptr). Overwrites y.
// f32 accumulation over f32 / f16 / bf16 weights, threaded on ctx.pool; the result does not depend on
// the thread count. ctx.reference_kernels: the plain reference kernel. Otherwise the fast kernel, whose
// ctx.matmul_precision kBF16 rounds x to bf16 for bf16 weights (core/context.h). Quantized (q8 / q4)
// weights take ops/cpu/quant.h: with AVX-512 VNNI, x is rounded to int8 per 32-column block.
void matmul_nt(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* bias, float* y);

}  // namespace dc
