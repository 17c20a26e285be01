// CPU attention backward: per (batch, KV head) work item, every query row of the heads sharing that KV
// head recomputes its softmax row, then accumulates dq (owned by the row) and dk / dv (owned by the item).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/kernel_variant.h"
#include "ops/cpu/attention_row.h"
#include "ops/cpu/backward_kernels.h"

namespace dc::cpu {
DC_KERNEL_VARIANT_BEGIN  // baseline:: here, avx2:: in kernels_avx2.cc

void attention_backward(ThreadPool* pool, const AttentionShape& s, const float* q, const float* k, const float* v,
                        const uint8_t* valid, const float* out, const float* dout, float* dq, float* dk,
                        float* dv) {
  const int64_t B = s.n_batch, L = s.n_seq, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  const int64_t group = H / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = H * D, kv_stride = Hkv * D;
  parallel_for(pool, B * Hkv, [&](int64_t begin, int64_t end) {
    std::vector<float> p(L), dp(L);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, hk = item % Hkv;
      const uint8_t* row_valid = valid ? valid + b * L : nullptr;
      for (int64_t j = 0; j < L; ++j) {
        std::fill_n(dk + (b * L + j) * kv_stride + hk * D, D, 0.0f);
        std::fill_n(dv + (b * L + j) * kv_stride + hk * D, D, 0.0f);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i = 0; i < L; ++i) {
          const int64_t qo = (b * L + i) * q_stride + h * D;
          float* dqi = dq + qo;
          std::fill_n(dqi, D, 0.0f);
          if (row_valid && !row_valid[i]) continue;
          const float* qi = q + qo;
          const float* oi = out + qo;
          const float* gi = dout + qo;
          const float max_score =
              attention_scores(qi, k + b * L * kv_stride + hk * D, L, kv_stride, D, scale, row_valid, p.data());
          float sum = 0;
          for (int64_t j = 0; j < L; ++j) {
            if (row_valid && !row_valid[j]) continue;
            p[j] = std::exp(p[j] - max_score);
            sum += p[j];
          }
          const float inv = 1.0f / sum;
          float delta = 0;  // rowsum(dout ⊙ out)
          for (int64_t t = 0; t < D; ++t) delta += gi[t] * oi[t];
          for (int64_t j = 0; j < L; ++j) {
            if (row_valid && !row_valid[j]) continue;
            const float pj = p[j] * inv;
            const float* vj = v + (b * L + j) * kv_stride + hk * D;
            float* dvj = dv + (b * L + j) * kv_stride + hk * D;
            float dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t t = 0; t < D; ++t) {
              dot += gi[t] * vj[t];
              dvj[t] += pj * gi[t];
            }
            const float ds = pj * (dot - delta) * scale;
            const float* kj = k + (b * L + j) * kv_stride + hk * D;
            float* dkj = dk + (b * L + j) * kv_stride + hk * D;
#pragma omp simd
            for (int64_t t = 0; t < D; ++t) {
              dqi[t] += ds * kj[t];
              dkj[t] += ds * qi[t];
            }
          }
        }
      }
    }
  }, 1);
}

DC_KERNEL_VARIANT_END
}  // namespace dc::cpu
