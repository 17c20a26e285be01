// The machine's achievable bf16 and int8 GEMM rates, measured with the fast matmul kernels: the yardsticks that
// benchmarks report their achieved GFLOP/s (GOP/s for the integer path) against.
#pragma once

#include "core/thread_pool.h"

namespace dc {

// Runs the fast bf16 matmul_nt (bf16 weights, activations rounded to bf16, f32 accumulation) on a large
// square-ish problem (x [512, 1024] · W [4096, 1024]ᵀ, 4.3 GFLOP a call) for about one second on `pool`
// (null: the calling thread) and returns the best GFLOP/s of the calls: on a machine shared with other
// jobs, the best of many short calls is the rate while the threads had the cores. Without AVX512_BF16
// the fast kernel falls back and this measures the fallback. Allocates ~12 MB while it runs.
double measure_bf16_gemm_peak_gflops(ThreadPool* pool);

// The int8 rate of the q8 / q4 weights' kernel (AVX-512 VNNI: activations quantized per row to int8, int8 ×
// int8 products summed in int32), on the same problem with q8 weights in the kPanels layout the models use,
// as the best of ~1 s of calls; 0 without AVX-512 VNNI (the quantized weights then run dequantized to f32).
// Allocates ~7 MB while it runs.
double measure_int8_gemm_peak_gops(ThreadPool* pool);

}  // namespace dc
