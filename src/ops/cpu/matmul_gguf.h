// CPU matmul_nt over weights in ggml's block formats (WeightQuant::kGguf, read in place from the GGUF
// file's bytes; ops/cpu/gguf_blocks.h): the AVX-512 VNNI kernel. The reference kernel (each row
// dequantized to f32, dot products in double) and the portable one are matmul_quant.cc's, through
// WeightView::row_to_f32. Raw pointers, no checks (the front-end in ops/matmul.cc checks).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "core/workspace.h"
#include "ops/weight.h"

namespace dc::cpu {

// y[n, w.rows] = x[n, w.cols] · dequant(w)ᵀ (+ bias[w.rows]). Overwrites y. Preconditions: w.quant ==
// kGguf, kRowMajor, cpu_has_avx512_vnni().
//
// x is rounded to int8 per row and 16-column group with scale sx = amax/127 (|x − x̂| ≤ sx/2 per element);
// each 32-row panel of w is decoded, 1024 columns at a time, into u8 codes c with an f32 scale s and
// offset o per row and 16 columns (w = s·c + o: ggml_decode_u8), and the group's Σ c·xq is an exact int32
// (vpdpbusd). So y differs from the dequantized weights' exact product by at most
// Σ_c |w[j, c]|·sx(c)/2 plus f32 rounding (k/16 f32 additions per output). Its block buffers are the
// calling threads' of `ws`; the result does not depend on the number of threads.
void matmul_nt_gguf_vnni(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                         const float* bias, float* y);

// Columns of x per int8 scale in matmul_nt_gguf_vnni (= kGgmlGroup).
constexpr int64_t kGgufXGroup = 16;

}  // namespace dc::cpu
