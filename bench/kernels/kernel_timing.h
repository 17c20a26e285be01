// What the quantized-kernel benchmarks (quant_bench.cc, gguf_bench.cc) share: the interleaved best-of-rounds
// timing loop and DC_BENCH_KM's shape (their kPanels copies: tests/packed_copy.h).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

namespace dc::bench {

// The best time in ms of each of n_kernels kernels (run(i) runs kernel i once) over `rounds` rounds, the
// kernels interleaved round by round so that a noisy machine slows them alike; skip(r, i) leaves kernel i out
// of round r (kernels never run keep 1e30).
inline std::vector<double> best_of_rounds(int rounds, size_t n_kernels, const std::function<void(size_t)>& run,
                                          const std::function<bool(int, size_t)>& skip = {}) {
  std::vector<double> best(n_kernels, 1e30);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < n_kernels; ++i) {
      if (skip && skip(r, i)) continue;
      const auto t0 = std::chrono::steady_clock::now();
      run(i);
      best[i] = std::min(best[i], std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  return best;
}

// DC_BENCH_KM=k,m replaces `shapes` ((k, m) pairs) by that one shape; k must be a positive multiple of
// k_multiple (`why` says whose). False, after a message naming `bench`, when it is malformed.
inline bool shape_from_env(const char* bench, int64_t k_multiple, const char* why,
                           std::vector<std::pair<int64_t, int64_t>>& shapes) {
  const char* e = std::getenv("DC_BENCH_KM");
  if (e == nullptr) return true;
  const char* comma = std::strchr(e, ',');
  if (comma == nullptr || std::atoll(e) <= 0 || std::atoll(e) % k_multiple != 0 || std::atoll(comma + 1) <= 0) {
    std::fprintf(stderr, "%s: DC_BENCH_KM must be k,m (k a positive multiple of %lld%s), got '%s'\n", bench,
                 static_cast<long long>(k_multiple), why, e);
    return false;
  }
  shapes = {{std::atoll(e), std::atoll(comma + 1)}};
  return true;
}

}  // namespace dc::bench
