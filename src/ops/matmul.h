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

// Words (uint32) of the kPanels layout (ops/weight.h) of a [rows, cols] weight.
int64_t panel_words(int64_t rows, int64_t cols);

// Writes panels [panel_begin, panel_end) (64 rows each) of the kPanels copy of the row-major bf16
// weight w into `out` (the whole copy: panel_words(w.rows, w.cols) words, 64-byte aligned), threaded on
// ctx.pool, and returns the view of the whole copy (valid once every panel is written). matmul_nt
// accepts it everywhere, with the same results as w (every kernel; the fast bf16-precision GEMM reads it
// without re-packing it). Chunks let a caller release w's pages as it goes.
WeightView pack_panels(const Context& ctx, const WeightView& w, uint32_t* out, int64_t panel_begin,
                       int64_t panel_end);

// Backward of y = x·wᵀ + bias (training), adding into the caller's buffers:
//   dx[n, w.cols] += dy·w      dw[w.rows, w.cols] += dyᵀ·x      dbias[w.rows] += Σ_rows dy
// Any of dx, dw, dbias may be nullptr (not wanted). w must be dense (f32 / f16 / bf16). Both products
// run through matmul_nt (the fast kernel unless ctx.reference_kernels) on transposed copies in f32.
void matmul_nt_backward(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* dy,
                        float* dx, float* dw, float* dbias);

}  // namespace dc
