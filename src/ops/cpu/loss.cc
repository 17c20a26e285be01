// CPU fused log-softmax + cross-entropy (forward and gradient in one pass per row).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/kernel_variant.h"
#include "ops/cpu/backward_kernels.h"

namespace dc::cpu {
DC_KERNEL_VARIANT_BEGIN  // baseline:: here, avx2:: in kernels_avx2.cc

double cross_entropy(ThreadPool* pool, const float* logits, const int32_t* targets, const float* weights, int64_t n,
                     int64_t n_vocab, float* dlogits, float* ce) {
  std::vector<double> row_loss(n);  // [n] weighted CE, summed in order at the end (thread-count independent)
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = logits + r * n_vocab;
      const float mx = *std::max_element(x, x + n_vocab);
      double sum = 0;
      for (int64_t c = 0; c < n_vocab; ++c) sum += std::exp(static_cast<double>(x[c] - mx));
      const double lse = mx + std::log(sum);
      const double loss = lse - x[targets[r]];
      if (ce != nullptr) ce[r] = static_cast<float>(loss);
      row_loss[r] = weights[r] * loss;
      if (dlogits == nullptr) continue;
      float* g = dlogits + r * n_vocab;
      const float w = weights[r];
      const float target_logit = x[targets[r]];  // read before g (which may alias x) is written
      for (int64_t c = 0; c < n_vocab; ++c) g[c] = w * static_cast<float>(std::exp(x[c] - lse));
      g[targets[r]] = w * (static_cast<float>(std::exp(target_logit - lse)) - 1.0f);
    }
  }, 1);
  double total = 0;
  for (double v : row_loss) total += v;
  return total;
}

DC_KERNEL_VARIANT_END
}  // namespace dc::cpu
