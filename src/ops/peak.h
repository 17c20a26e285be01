// The machine's achievable bf16 GEMM rate, measured with the fast matmul kernel: the yardstick that
// benchmarks report their achieved GFLOP/s against.
#pragma once

#include "core/thread_pool.h"

namespace dc {

// Runs the fast bf16 matmul_nt (bf16 weights, activations rounded to bf16, f32 accumulation) on a large
// square-ish problem (x [512, 1024] · W [4096, 1024]ᵀ, 4.3 GFLOP a call) for about one second on `pool`
// (null: the calling thread) and returns the best GFLOP/s of the calls: on a machine shared with other
// jobs, the best of many short calls is the rate while the threads had the cores. Without AVX512_BF16
// the fast kernel falls back and this measures the fallback. Allocates ~12 MB while it runs.
double measure_bf16_gemm_peak_gflops(ThreadPool* pool);

}  // namespace dc
