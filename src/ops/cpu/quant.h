// CPU matmul_nt over quantized weights (WeightQuant kQ8 / kQ4, see ops/weight.h): a reference kernel,
// a portable dequantize-to-f32 kernel and an AVX-512 VNNI int8 kernel. Raw pointers, no checks (the
// front-end in ops/matmul.cc checks).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "core/workspace.h"
#include "ops/weight.h"

namespace dc::cpu {

enum class QuantKernel {
  kAuto,        // kInt8Vnni where the CPU and the weight allow it, else kDequantF32
  kReference,   // each weight row dequantized to f32, dot products accumulated in double: the oracle
  kDequantF32,  // blocks of 32 weight rows dequantized to f32 per thread, f32 FMA tiles; x used exactly
  kInt8Vnni,    // x rounded to int8 per row and 128-column block, u8×s8 dot products (vpdpbusd)
};

// y[n, w.rows] = x[n, w.cols] · dequant(w)ᵀ (+ bias[w.rows] when bias != nullptr). Overwrites y.
// Precondition: w.quantized(). kGguf weights (ggml blocks, read in place) take the same three kernels:
// kReference and kDequantF32 through WeightView::row_to_f32, kInt8Vnni is matmul_nt_gguf_vnni. Threads over blocks of weight rows; the result does not depend on the
// number of threads. kInt8Vnni rounds each 128-column block of a row of x to int8 with scale amax/127
// (error ≤ amax/254 per element) and accumulates exact int32 sums per block (kQ4: per group), then
// f32 across them; it needs cpu_has_avx512_vnni() and, for kQ4, a group_size of 32, 64 or a multiple
// of 128 (else it runs kDequantF32). Its block buffers are the calling threads' of `ws`.
constexpr int64_t kInt8XBlock = 128;  // kInt8Vnni: columns of x per int8 scale
void matmul_nt_quant(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                     const float* bias, float* y, QuantKernel kernel = QuantKernel::kAuto);

// Panels [panel_begin, panel_end) (32 rows each) of the kPanels copy (ops/weight.h) of the row-major
// quantized weight w: codes (the whole copy, 64-byte aligned) and, kQ4, the f16 scale and min tables.
// Precondition: cpu_has_avx512_vnni(); kQ4 needs group_size % 32 == 0.
void pack_quant_panels(ThreadPool* pool, const WeightView& w, int64_t panel_begin, int64_t panel_end, uint8_t* codes,
                       uint16_t* scales, uint16_t* mins);

// AVX-512 F/BW/VL/DQ plus VNNI (vpdpbusd) at run time; false while force_portable_kernels_for_testing.
bool cpu_has_avx512_vnni();

// Whether kInt8Vnni (and kAuto) run the int8 kernel on w (else kDequantF32): cpu_has_avx512_vnni(), and
// kQ8, kQ4 with a group_size of 32, 64 or a multiple of kInt8XBlock, or kGguf (row-major; its own
// kernel, ops/cpu/matmul_gguf.h: x rounded per 16 columns).
bool int8_kernel_supports(const WeightView& w);

}  // namespace dc::cpu
