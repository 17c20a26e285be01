// CPU matmul_nt over weights in ggml's block formats (WeightQuant::kGguf, read in place from the GGUF
// file's bytes; ops/cpu/gguf_blocks.h): the AVX-512 VNNI kernels, two paths chosen by the rows of x. The reference kernel (each row
// dequantized to f32, dot products in double) and the portable one are matmul_quant.cc's, through
// WeightView::row_to_f32. Raw pointers, no checks (the front-end in ops/matmul.cc checks).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "core/workspace.h"
#include "ops/weight.h"

namespace dc::cpu {

// Columns of x per int8 scale in matmul_nt_gguf_vnni (= kGgmlGroup).
constexpr int64_t kGgufXGroup = 16;

// How matmul_nt_gguf_vnni walks the weights. kPanels: each 32-row panel of w is decoded 1024 columns at a
// time into the q8 kernel's lane-interleaved layout (u8 codes, a 16×16 transpose) and read by every row of
// x: the decoding is paid once per weight, whatever n, and the products run 32 weight rows per broadcast
// of x. kRows: each weight row is decoded 256 columns at a time straight into registers and dotted with
// ≤ 4 rows of x at once (ggml's vec_dot shape; matmul_gguf_rows.cc): no buffer, no transpose, but the
// decoding is paid once per 4 rows of x. kAuto: kRows for n ≤ kGgufRowsMaxN, else kPanels.
enum class GgufPath { kAuto, kPanels, kRows };
constexpr int64_t kGgufRowsMaxN = 4;

// y[n, w.rows] = x[n, w.cols] · dequant(w)ᵀ (+ bias[w.rows]). Overwrites y. Preconditions: w.quant ==
// kGguf, kRowMajor, cpu_has_avx512_vnni().
//
// x is rounded to int8 per row and 16-column group with scale sx = amax/127 (|x − x̂| ≤ sx/2 per element);
// w is decoded into u8 codes c with an f32 scale s and offset o per row and 16 columns (w = s·c + o:
// ggml_decode_u8, vectorized), and each 4-column Σ c·xq is an exact int32 (vpdpbusd). So y differs from
// the dequantized weights' exact product by at most Σ_c |w[j, c]|·sx(c)/2 plus f32 rounding (about k/16
// f32 additions per output). Both paths give that bound; their f32 roundings differ (so kPanels and kRows
// agree to a few ulps of the sum's terms, not bit for bit). Its buffers are the calling threads' of
// `ws`; the result does not depend on the number of threads.
void matmul_nt_gguf_vnni(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                         const float* bias, float* y, GgufPath path = GgufPath::kAuto);

// x rounded as above: q[n, k] int8, per row and 16-column group g the scale sx[n, k/16] and sx·Σ xq in
// sxs[n, k/16].
struct GgufQuantizedX {
  const int8_t* q;
  const float* sx;
  const float* sxs;
  int64_t k;
};

// The kRows path over the rounded x (matmul_gguf_rows.cc); same contract as matmul_nt_gguf_vnni.
void matmul_nt_gguf_rows_vnni(ThreadPool* pool, const GgufQuantizedX& xq, int64_t n, const WeightView& w,
                              const float* bias, float* y);

}  // namespace dc::cpu
