// CPU attention of a window of queries over all L keys: one (batch, head, query) row at a time, scores
// in a per-thread buffer of length L, exact softmax (max-subtracted), f32 throughout. The per-row
// arithmetic is that of cpu::attention, so a full window reproduces it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/kernel_variant.h"
#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/cpu/attention_row.h"

namespace dc::cpu {
DC_KERNEL_VARIANT_BEGIN  // baseline:: here, avx2:: in kernels_avx2.cc

void attention_window(ThreadPool* pool, const AttentionShape& s, int64_t window_begin, int64_t window_len,
                      const float* q, const float* k, const float* v, const uint8_t* valid, float* out,
                      const int64_t* positions) {
  const int64_t B = s.n_batch, L = s.n_seq, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  const int64_t W = window_len;
  const int64_t group = H / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = H * D, kv_stride = Hkv * D;  // between consecutive positions
  // Work items: (b, h, i) flattened with the window index i fastest.
  parallel_for(pool, B * H * W, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(L);
    std::vector<float> acc(D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item % W, h = (item / W) % H, b = item / (W * H);
      const int64_t hk = h / group;
      float* o = out + (b * W + i) * q_stride + h * D;
      const uint8_t* row_valid = valid ? valid + b * L : nullptr;
      if (row_valid && !row_valid[positions != nullptr ? positions[i] : window_begin + i]) {
        std::fill(o, o + D, 0.0f);
        continue;
      }
      const float* qi = q + (b * W + i) * q_stride + h * D;
      const float max_score =
          attention_scores(qi, k + b * L * kv_stride + hk * D, L, kv_stride, D, scale, row_valid, scores.data());
      std::fill(acc.begin(), acc.end(), 0.0f);
      float sum = 0;
      for (int64_t j = 0; j < L; ++j) {
        if (row_valid && !row_valid[j]) continue;
        const float p = std::exp(scores[j] - max_score);
        sum += p;
        const float* vj = v + (b * L + j) * kv_stride + hk * D;
#pragma omp simd
        for (int64_t t = 0; t < D; ++t) acc[t] += p * vj[t];
      }
      const float inv = 1.0f / sum;  // sum >= 1: the query itself is a valid key
      for (int64_t t = 0; t < D; ++t) o[t] = acc[t] * inv;
    }
  }, 8);
}

DC_KERNEL_VARIANT_END
}  // namespace dc::cpu
