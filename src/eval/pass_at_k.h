// The unbiased pass@k estimator of Chen et al. 2021 (Codex paper, eq. 1), as openai/human-eval
// computes it: 1 − C(n − c, k) / C(n, k) for n samples of which c passed, evaluated as the product
// 1 − Π_{i = n−c+1}^{n} (1 − k / i) (no large binomials).
#pragma once

#include <cstdint>

namespace dc::eval {

// pass@k for one task. 1 when n − c < k (every k-subset holds a passing sample); requires 0 ≤ c ≤ n
// and 1 ≤ k ≤ n (callers report pass@k only for k ≤ n).
inline double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (n - c < k) return 1.0;
  double prod = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) prod *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - prod;
}

}  // namespace dc::eval
