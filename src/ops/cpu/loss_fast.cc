// Fast CPU fused log-softmax + cross-entropy: the reference's row pass (loss.cc) in AVX-512, exp by the
// 2-ulp polynomial in f32 with the row's Σ e^(x − max) accumulated in double. Rows are the parallelism and
// the weighted losses are summed in row order, so the result does not depend on the thread count.
#include <cmath>
#include <vector>

#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12 AVX-512 headers: see matmul_fast.cc
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using simd::mask16;

// One row: returns logsumexp(x) and, when g is not null, writes g = w · softmax(x) (the target's −w
// is the caller's). g may alias x.
DC_TARGET_AVX512 double row_lse(const float* x, int64_t v, float w, float* g) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t c = 0; c < v; c += 16) {
    const __mmask16 m = mask16(v - c);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + c));
  }
  const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t c = 0; c < v; c += 16) {
    const __mmask16 m = mask16(v - c);
    const __m512 e = _mm512_maskz_mov_ps(m, simd::exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + c), mv)));
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  const double lse = static_cast<double>(_mm512_reduce_max_ps(mx)) + std::log(_mm512_reduce_add_pd(_mm512_add_pd(s0, s1)));
  if (g == nullptr) return lse;
  const __m512 lv = _mm512_set1_ps(static_cast<float>(lse)), wv = _mm512_set1_ps(w);
  for (int64_t c = 0; c < v; c += 16) {
    const __mmask16 m = mask16(v - c);
    const __m512 e = simd::exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + c), lv));
    _mm512_mask_storeu_ps(g + c, m, _mm512_mul_ps(wv, e));
  }
  return lse;
}

}  // namespace

double cross_entropy_fast(ThreadPool* pool, const float* logits, const int32_t* targets, const float* weights,
                          int64_t n, int64_t n_vocab, float* dlogits, float* ce) {
  if (!cpu_has_avx512()) return cross_entropy(pool, logits, targets, weights, n, n_vocab, dlogits, ce);
  std::vector<double> row_loss(n);  // [n] weighted CE, summed in order at the end
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = logits + r * n_vocab;
      const float target_logit = x[targets[r]];  // read before g (which may alias x) is written
      float* g = dlogits != nullptr ? dlogits + r * n_vocab : nullptr;
      const double lse = row_lse(x, n_vocab, weights[r], g);
      const double loss = lse - target_logit;
      if (ce != nullptr) ce[r] = static_cast<float>(loss);
      row_loss[r] = weights[r] * loss;
      if (g != nullptr) g[targets[r]] = weights[r] * (static_cast<float>(std::exp(target_logit - lse)) - 1.0f);
    }
  }, 1);
  double total = 0;
  for (double v : row_loss) total += v;
  return total;
}

}  // namespace dc::cpu
