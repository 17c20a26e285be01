// measure_bf16_gemm_peak_gflops: timed runs of the fast bf16 matmul on one large problem.
#include "ops/peak.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "ops/cpu/kernels.h"

namespace dc {

double measure_bf16_gemm_peak_gflops(ThreadPool* pool) {
  constexpr int64_t n = 512, m = 4096, k = 1024;
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> w(m * k);
  for (auto& v : w) v = f32_to_bf16(dist(gen));
  std::vector<float> x(n * k), y(n * m);
  for (auto& v : x) v = dist(gen);
  const WeightView view{DType::kBF16, w.data(), m, k};
  const double flops = 2.0 * n * m * k;
  double best = 0;
  Workspace ws;  // the kernel's block buffers, reused across the repetitions
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0;; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::matmul_nt_fast(pool, ws, x.data(), n, view, nullptr, y.data(), MatmulPrecision::kBF16);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, flops / std::chrono::duration<double>(t1 - t0).count() * 1e-9);
    if (rep >= 2 && std::chrono::duration<double>(t1 - start).count() > 1.0) break;
  }
  return best;
}

}  // namespace dc
