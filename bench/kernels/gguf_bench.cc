// gguf_bench: matmul_nt over ggml block weights read in place (WeightQuant::kGguf: Q8_0 Q4_0 Q4_1 Q5_0 Q5_1
// Q2_K Q3_K Q4_K Q5_K Q6_K; the AVX-512 VNNI kernel of ops/cpu/matmul_gguf.h) next to the engine's own q8
// and q4 (group 32) kPanels kernels, at the DiffuCoder-7B MLP shapes (k, m) = (3584, 18944) and
// (18944, 3584), n = 1 and 33 rows of x. Kernels interleaved round by round (the best of the rounds counts).
// Environment: DC_BENCH_THREADS (default: all), DC_BENCH_ROUNDS (default 5), DC_BENCH_N (n, or a comma
// list: 1,33,320), DC_BENCH_KM=k,m (one shape; k a multiple of 256), DC_BENCH_PATH=rows|panels (the GGUF
// kernels' path, matmul_gguf.h; default: chosen by n). Usage: build/bench/gguf_bench (BENCHMARKS.md).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/context.h"
#include "core/splitmix64.h"
#include "ops/cpu/gguf_blocks.h"
#include "ops/cpu/matmul_gguf.h"
#include "ops/cpu/quant.h"
#include "ops/matmul.h"
#include "kernel_timing.h"
#include "packed_copy.h"
#include "quant_holder.h"

namespace {

using dc::cpu::GgmlType;
using QuantKernel = dc::cpu::QuantKernel;

// Random blocks with a finite f16 d (and dmin / m) in every block: the speed does not depend on the values.
std::vector<uint8_t> random_blocks(GgmlType t, int64_t rows, int64_t cols) {
  const dc::cpu::GgmlBlockInfo info = dc::cpu::ggml_block_info(t);
  std::vector<uint8_t> b(static_cast<size_t>(rows * cols / info.values * info.bytes));
  for (size_t i = 0; i < b.size(); i += 8) {
    const uint64_t r = dc::splitmix64(i);
    std::memcpy(b.data() + i, &r, std::min<size_t>(8, b.size() - i));
  }
  const size_t d_at = t == GgmlType::kQ6_K ? 208 : t == GgmlType::kQ3_K ? 108 : t == GgmlType::kQ2_K ? 80 : 0;
  const uint16_t small = dc::f32_to_f16(0.001f);
  for (size_t blk = 0; blk < b.size() / static_cast<size_t>(info.bytes); ++blk) {
    uint8_t* p = b.data() + blk * static_cast<size_t>(info.bytes) + d_at;
    std::memcpy(p, &small, 2);
    if (t != GgmlType::kQ6_K && t != GgmlType::kQ3_K && t != GgmlType::kQ8_0 && t != GgmlType::kQ4_0 && t != GgmlType::kQ5_0)
      std::memcpy(p + 2, &small, 2);
  }
  return b;
}

void bench_shape(dc::ThreadPool& pool, dc::Workspace& ws, int64_t k, int64_t m, const std::vector<int64_t>& ns, int rounds,
                 dc::cpu::GgufPath path) {
  const dc::testing::QuantHolder q8(dc::WeightQuant::kQ8, m, k, 0, 1), q4(dc::WeightQuant::kQ4, m, k, 32, 3);
  const dc::testing::PackedCopy q8_packed(&pool, q8.view), q4_packed(&pool, q4.view);
  const GgmlType types[] = {GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kQ5_K, GgmlType::kQ4_K, GgmlType::kQ3_K,
                            GgmlType::kQ2_K, GgmlType::kQ5_1, GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ4_0};
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<std::pair<std::string, dc::WeightView>> weights = {{"q8 kPanels (ours)", q8_packed.view},
                                                                 {"q4 g32 kPanels (ours)", q4_packed.view}};
  for (GgmlType t : types) {
    blocks.push_back(random_blocks(t, m, k));
    dc::WeightView w;
    w.dtype = dc::DType::kU8;
    w.quant = dc::WeightQuant::kGguf;
    w.ggml_type = t;
    w.data = blocks.back().data();
    w.rows = m;
    w.cols = k;
    weights.emplace_back(std::string("GGUF ") + dc::cpu::ggml_block_info(t).name, w);
  }
  for (int64_t n : ns) {
    const auto x = dc::testing::random_x(n, k, 5);
    std::vector<float> y(static_cast<size_t>(n * m));
    const std::vector<double> best = dc::bench::best_of_rounds(rounds, weights.size(), [&](size_t i) {
      if (weights[i].second.quant == dc::WeightQuant::kGguf && path != dc::cpu::GgufPath::kAuto) {
        dc::cpu::matmul_nt_gguf_vnni(&pool, ws, x.data(), n, weights[i].second, nullptr, y.data(), path);
      } else {
        dc::cpu::matmul_nt_quant(&pool, ws, x.data(), n, weights[i].second, nullptr, y.data(), QuantKernel::kInt8Vnni);
      }
    });
    for (size_t i = 0; i < weights.size(); ++i) {
      const dc::WeightView& w = weights[i].second;
      const double bytes = w.quant == dc::WeightQuant::kGguf ? static_cast<double>(dc::cpu::ggml_row_bytes(w.ggml_type, k)) * m
                           : w.quant == dc::WeightQuant::kQ8 ? static_cast<double>(m) * k + 4.0 * m
                                                              : static_cast<double>(m) * k / 2 + 4.0 * m * (k / 32);
      std::printf("k %5lld m %5lld n %3lld  %-22s %8.2f ms  %6.1f GMAC/s  %6.1f GB/s of weights  %5.2f bits/weight\n",
                  (long long)k, (long long)m, (long long)n, weights[i].first.c_str(), best[i], 1e-6 * n * m * k / best[i],
                  1e-6 * bytes / best[i], 8.0 * bytes / (static_cast<double>(m) * k));
    }
  }
}

}  // namespace

int main() {
  if (!dc::cpu::cpu_has_avx512_vnni()) {
    std::fprintf(stderr, "gguf_bench: this CPU has no AVX-512 VNNI (the kernels timed here need it)\n");
    return 1;
  }
  std::vector<std::pair<int64_t, int64_t>> shapes = {{3584, 18944}, {18944, 3584}};  // (k, m)
  if (!dc::bench::shape_from_env("gguf_bench", 256, "", shapes)) return 2;
  std::vector<int64_t> ns = {1, 33};
  if (const char* e = std::getenv("DC_BENCH_N")) {
    ns.clear();
    for (const char* p = e; p != nullptr && *p != '\0'; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : nullptr)
      ns.push_back(std::max<int64_t>(1, std::atoll(p)));
  }
  dc::cpu::GgufPath path = dc::cpu::GgufPath::kAuto;
  if (const char* e = std::getenv("DC_BENCH_PATH")) path = std::strcmp(e, "rows") == 0 ? dc::cpu::GgufPath::kRows : dc::cpu::GgufPath::kPanels;
  const int threads = std::getenv("DC_BENCH_THREADS") ? std::atoi(std::getenv("DC_BENCH_THREADS"))
                                                      : static_cast<int>(std::thread::hardware_concurrency());
  const int rounds = std::getenv("DC_BENCH_ROUNDS") ? std::max(1, std::atoi(std::getenv("DC_BENCH_ROUNDS"))) : 5;
  dc::ThreadPool pool(std::max(1, threads));
  dc::Workspace ws;
  for (const auto& [k, m] : shapes) bench_shape(pool, ws, k, m, ns, rounds, path);
  return 0;
}
