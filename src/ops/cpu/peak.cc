// measure_bf16_gemm_peak_gflops / measure_int8_gemm_peak_gops: timed runs of the fast matmuls on one large problem.
#include "ops/peak.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "core/workspace.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant.h"
#include "ops/matmul.h"
#include "types/quantization.h"

namespace dc {
namespace {

constexpr int64_t kRows = 512, kOut = 4096, kIn = 1024;  // x [kRows, kIn] · W [kOut, kIn]ᵀ: 4.3 GFLOP a call

// The best rate of `call` (returning nothing, doing `ops` operations) over >= 3 calls and about one second.
template <typename Call>
double best_rate(double ops, Call&& call) {
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0;; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, ops / std::chrono::duration<double>(t1 - t0).count() * 1e-9);
    if (rep >= 2 && std::chrono::duration<double>(t1 - start).count() > 1.0) break;
  }
  return best;
}

}  // namespace

double measure_bf16_gemm_peak_gflops(ThreadPool* pool) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> w(kOut * kIn);
  for (auto& v : w) v = f32_to_bf16(dist(gen));
  std::vector<float> x(kRows * kIn), y(kRows * kOut);
  for (auto& v : x) v = dist(gen);
  const WeightView view{DType::kBF16, w.data(), kOut, kIn};
  Workspace ws;  // the kernel's block buffers, reused across the repetitions
  return best_rate(2.0 * kRows * kOut * kIn, [&] {
    cpu::matmul_nt_fast(pool, ws, x.data(), kRows, view, nullptr, y.data(), MatmulPrecision::kBF16);
  });
}

double measure_int8_gemm_peak_gops(ThreadPool* pool) {
  if (!cpu::cpu_has_avx512_vnni()) return 0;
  std::mt19937 gen(1);
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<int8_t> codes(kOut * kIn);
  for (auto& c : codes) c = static_cast<int8_t>(code(gen));
  std::vector<float> scales(kOut, 1.0f / 127), x(kRows * kIn), y(kRows * kOut);
  for (auto& v : x) v = dist(gen);
  WeightView w{DType::kI8, codes.data(), kOut, kIn};
  w.quant = WeightQuant::kQ8, w.scales = scales.data();
  Workspace ws;
  Context ctx;
  ctx.pool = pool, ctx.workspace = &ws;
  const PanelSizes sizes = panel_sizes(w);  // the models' layout (Model::pack_weights)
  const std::unique_ptr<void, decltype(&std::free)> panels(
      std::aligned_alloc(64, static_cast<size_t>((sizes.data_bytes + 63) & ~int64_t{63})), &std::free);
  if (panels == nullptr) return 0;
  const WeightView packed = pack_panels(ctx, w, panels.get(), nullptr, nullptr, 0, sizes.panels);
  return best_rate(2.0 * kRows * kOut * kIn, [&] { matmul_nt(ctx, x.data(), kRows, packed, nullptr, y.data()); });
}

}  // namespace dc
