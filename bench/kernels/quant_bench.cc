// quant_bench: the quantized matmul_nt kernels (q8, q4 at group 128 and 32; row-major and kPanels; the
// int8 VNNI kernel and the portable dequantize-to-f32 one) against the bf16 kernel at the DiffuCoder-7B
// MLP shapes (k, m) = (3584, 18944) and (18944, 3584), n = 33 (the rows of a --cache dual step at block
// length 32) and 320 rows of x. Kernels interleaved round by round (the best of the rounds counts), so that
// a noisy machine slows them alike. Environment (as the GoogleTest benchmark it replaces):
//   DC_BENCH_THREADS  threads (default: all)        DC_BENCH_ROUNDS  rounds (default 5; the portable kernels 2)
//   DC_BENCH_N        one n instead of 33 and 320   DC_BENCH_KM=k,m  one shape
//   DC_BENCH_QUICK=1  only the kPanels kernels
// Usage: build/bench/quant_bench (docs/bench.md; BENCHMARKS.md "Quantized weights").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"
#include "ops/cpu/quant.h"
#include "ops/matmul.h"
#include "kernel_timing.h"
#include "packed_copy.h"
#include "quant_holder.h"

namespace {

using dc::testing::QuantHolder;
using dc::testing::random_x;
using QuantKernel = dc::cpu::QuantKernel;

// Every kernel at one shape and n; a line per kernel: ms, GMAC/s and the speed-up over bf16 weights at f32.
void bench_shape(dc::ThreadPool& pool, dc::Workspace& ws, int64_t k, int64_t m, const std::vector<int64_t>& ns) {
  const QuantHolder q8(dc::WeightQuant::kQ8, m, k, 0, 1), q4(dc::WeightQuant::kQ4, m, k, 128, 2),
      q4_32(dc::WeightQuant::kQ4, m, k, 32, 3);
  std::vector<uint16_t> bf16(m * k);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = dc::f32_to_bf16(q8.dense[i]);
  const dc::WeightView wb{dc::DType::kBF16, bf16.data(), m, k};
  const dc::testing::PackedCopy wb_packed(&pool, wb), q8_packed(&pool, q8.view), q4_packed(&pool, q4.view),
      q4_32_packed(&pool, q4_32.view);
  for (int64_t n : ns) {
    const auto x = random_x(n, k, 5);
    std::vector<float> y(n * m);
    dc::Context f32{dc::Device::kCpu, &pool}, bf{dc::Device::kCpu, &pool};
    bf.matmul_precision = dc::MatmulPrecision::kBF16;
    auto quant = [&](const dc::WeightView& w, QuantKernel kernel) {
      return [&, w, kernel] { dc::cpu::matmul_nt_quant(&pool, ws, x.data(), n, w, nullptr, y.data(), kernel); };
    };
    const std::vector<std::pair<std::string, std::function<void()>>> kernels = {
        {"bf16 weights, f32 activ.", [&] { dc::matmul_nt(f32, x.data(), n, wb, nullptr, y.data()); }},
        {"bf16 weights, bf16 activ.", [&] { dc::matmul_nt(bf, x.data(), n, wb, nullptr, y.data()); }},
        {"bf16 kPanels, bf16 activ.", [&] { dc::matmul_nt(bf, x.data(), n, wb_packed.view, nullptr, y.data()); }},
        {"q8 int8 vnni", quant(q8.view, QuantKernel::kInt8Vnni)},
        {"q4 g128 int8 vnni", quant(q4.view, QuantKernel::kInt8Vnni)},
        {"q8 kPanels int8 vnni", quant(q8_packed.view, QuantKernel::kInt8Vnni)},
        {"q4 g128 kPanels int8 vnni", quant(q4_packed.view, QuantKernel::kInt8Vnni)},
        {"q4 g32 kPanels int8 vnni", quant(q4_32_packed.view, QuantKernel::kInt8Vnni)},
        {"q8 dequant f32 (portable)", quant(q8.view, QuantKernel::kDequantF32)},
        {"q4 dequant f32 (portable)", quant(q4.view, QuantKernel::kDequantF32)},
    };
    const int rounds = std::getenv("DC_BENCH_ROUNDS") ? std::atoi(std::getenv("DC_BENCH_ROUNDS")) : 5;
    const std::vector<double> best = dc::bench::best_of_rounds(
        rounds, kernels.size(), [&](size_t i) { kernels[i].second(); },
        [&](int r, size_t i) {
          const std::string& name = kernels[i].first;
          if (r >= 2 && name.find("portable") != std::string::npos) return true;  // slow: two rounds
          return std::getenv("DC_BENCH_QUICK") != nullptr && name.find("kPanels") == std::string::npos;
        });
    for (size_t i = 0; i < kernels.size(); ++i)
      std::printf("k %5lld m %5lld n %3lld  %-28s %8.2f ms  %6.1f GMAC/s  %5.2fx bf16/f32\n", (long long)k,
                  (long long)m, (long long)n, kernels[i].first.c_str(), best[i], 1e-6 * n * m * k / best[i],
                  best[0] / best[i]);
  }
}

}  // namespace

int main() {
  if (!dc::cpu::cpu_has_avx512_vnni()) {
    std::fprintf(stderr, "quant_bench: this CPU has no AVX-512 VNNI (the int8 kernels and kPanels copies need it)\n");
    return 1;
  }
  std::vector<std::pair<int64_t, int64_t>> shapes = {{3584, 18944}, {18944, 3584}};  // (k, m)
  if (!dc::bench::shape_from_env("quant_bench", 128, ", the q4 group", shapes)) return 2;
  std::vector<int64_t> ns = {33, 320};
  if (const char* e = std::getenv("DC_BENCH_N")) ns = {std::atoll(e)};
  if (ns[0] < 1) {
    std::fprintf(stderr, "quant_bench: DC_BENCH_N must be a positive integer\n");
    return 2;
  }
  dc::ThreadPool pool(std::getenv("DC_BENCH_THREADS") ? std::atoi(std::getenv("DC_BENCH_THREADS")) : 0);
  dc::Workspace ws;
  std::printf("threads %d, vnni %d\n", pool.n_threads(), dc::cpu::cpu_has_avx512_vnni() ? 1 : 0);
  for (auto [k, m] : shapes) bench_shape(pool, ws, k, m, ns);
  return 0;
}
