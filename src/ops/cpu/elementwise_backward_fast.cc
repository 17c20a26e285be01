// Fast CPU backward passes of RMSNorm and SwiGLU (AVX-512; RoPE's is rope_apply_fast's inverse rotation).
// RMSNorm: one pass per row for Σx² and Σ w·dy·x (in double, as the reference), then dx += r·w·dy − x·c —
// the residual stream's gradient summed in the same pass, no temporary; dw over column blocks, rows in
// order (the reference's order; the result does not depend on the thread count). SwiGLU: dgate and
// dup in one pass with the forward's 2-ulp exp.
#include <algorithm>
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

// Σ of a · b over 16 lanes, in double.
DC_TARGET_AVX512 DC_INLINE __m512d widen_lo(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
DC_TARGET_AVX512 DC_INLINE __m512d widen_hi(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// Rows [i0, i1): rstd[i], and dx[i] += r·w·dy − x·(Σ w·dy·x)·r³/d when dx is not null.
DC_TARGET_AVX512 void rms_backward_rows(const float* x, const float* w, const float* dy, int64_t i0, int64_t i1,
                                        int64_t d, float eps, float* dx, float* rstd) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * d;
    const float* gi = dy + i * d;
    __m512d ss0 = _mm512_setzero_pd(), ss1 = _mm512_setzero_pd(), dt0 = _mm512_setzero_pd(), dt1 = _mm512_setzero_pd();
    for (int64_t t = 0; t < d; t += 16) {
      const __mmask16 m = mask16(d - t);
      const __m512 xv = _mm512_maskz_loadu_ps(m, xi + t);
      const __m512d xl = widen_lo(xv), xh = widen_hi(xv);
      ss0 = _mm512_fmadd_pd(xl, xl, ss0);
      ss1 = _mm512_fmadd_pd(xh, xh, ss1);
      if (dx == nullptr) continue;
      const __m512 wg = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + t), _mm512_maskz_loadu_ps(m, gi + t));
      dt0 = _mm512_fmadd_pd(widen_lo(wg), xl, dt0);
      dt1 = _mm512_fmadd_pd(widen_hi(wg), xh, dt1);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(ss0, ss1));
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
    rstd[i] = r;
    if (dx == nullptr) continue;
    const float c = static_cast<float>(_mm512_reduce_add_pd(_mm512_add_pd(dt0, dt1))) * r * r * r / static_cast<float>(d);
    const __m512 rv = _mm512_set1_ps(r), cv = _mm512_set1_ps(c);
    float* o = dx + i * d;
    for (int64_t t = 0; t < d; t += 16) {
      const __mmask16 m = mask16(d - t);
      const __m512 rwg = _mm512_mul_ps(_mm512_mul_ps(rv, _mm512_maskz_loadu_ps(m, w + t)), _mm512_maskz_loadu_ps(m, gi + t));
      const __m512 v = _mm512_sub_ps(rwg, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + t), cv));
      _mm512_mask_storeu_ps(o + t, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, o + t), v));
    }
  }
}

// dw[t] += Σ_rows dy·x·r for columns [t0, t1), rows in order.
DC_TARGET_AVX512 void rms_backward_dw(const float* x, const float* dy, const float* rstd, int64_t n, int64_t d,
                                      int64_t t0, int64_t t1, float* dw) {
  for (int64_t t = t0; t < t1; t += 16) {
    const __mmask16 m = mask16(t1 - t);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      const __m512 g = _mm512_maskz_loadu_ps(m, dy + i * d + t), xv = _mm512_maskz_loadu_ps(m, x + i * d + t);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(g, xv), _mm512_set1_ps(rstd[i])));
    }
    _mm512_mask_storeu_ps(dw + t, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dw + t), acc));
  }
}

// [b, e) of dgate = dout·up·s·(1 + g·(1 − s)), dup = dout·g·s with s = sigmoid(g); dgate / dup may alias dout.
DC_TARGET_AVX512 void swiglu_backward_range(const float* gate, const float* up, const float* dout, int64_t b,
                                            int64_t e, float* dgate, float* dup) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = b; i < e; i += 16) {
    const __mmask16 m = mask16(e - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 d = _mm512_maskz_loadu_ps(m, dout + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, simd::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    const __m512 ds = _mm512_mul_ps(d, s);
    const __m512 dg = _mm512_mul_ps(_mm512_mul_ps(ds, u), _mm512_add_ps(one, _mm512_mul_ps(g, _mm512_sub_ps(one, s))));
    _mm512_mask_storeu_ps(dup + i, m, _mm512_mul_ps(ds, g));
    _mm512_mask_storeu_ps(dgate + i, m, dg);
  }
}

}  // namespace

void rms_norm_backward_fast(ThreadPool* pool, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                            float eps, float* dx, float* dw) {
  if (!cpu_has_avx512()) return rms_norm_backward(pool, x, w, dy, n, d, eps, dx, dw);
  std::vector<float> rstd(n);  // [n]
  parallel_for(pool, n, [&](int64_t b, int64_t e) { rms_backward_rows(x, w, dy, b, e, d, eps, dx, rstd.data()); }, 4);
  if (dw == nullptr) return;
  constexpr int64_t kCols = 64;  // columns per task, each thread owning its dw[t0, t1)
  parallel_for(pool, (d + kCols - 1) / kCols, [&](int64_t b, int64_t e) {
    rms_backward_dw(x, dy, rstd.data(), n, d, b * kCols, std::min(d, e * kCols), dw);
  });
}

void swiglu_backward_fast(ThreadPool* pool, const float* gate, const float* up, const float* dout, int64_t count,
                          float* dgate, float* dup) {
  if (!cpu_has_avx512()) return swiglu_backward(pool, gate, up, dout, count, dgate, dup);
  const int64_t blocks = (count + 1023) / 1024;  // whole multiples of 16 elements: only the last is masked
  parallel_for(pool, blocks, [&](int64_t b, int64_t e) {
    swiglu_backward_range(gate, up, dout, b * 1024, std::min(count, e * 1024), dgate, dup);
  });
}

}  // namespace dc::cpu
