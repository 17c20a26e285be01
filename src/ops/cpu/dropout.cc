// The CPU kernel of hashed dropout (ops/dropout.h): one variant (integer hashing, nothing to vectorise).
#include "ops/cpu/kernels.h"
#include "ops/dropout.h"

namespace dc::cpu {

void dropout(ThreadPool* pool, const float* x, int64_t n, int64_t d, uint64_t seed, uint64_t threshold, float keep_scale,
             float* y) {
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (int64_t c = 0; c < d; ++c) y[i * d + c] = dropout_keeps(seed, i, c, threshold) ? x[i * d + c] * keep_scale : 0.0f;
  });
}

}  // namespace dc::cpu
