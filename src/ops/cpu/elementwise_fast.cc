// Fast CPU RMSNorm, RoPE, SwiGLU, residual add and zero fill: AVX-512 over rows, threaded only where the work
// pays for waking the pool. Same formulas and operation order as the reference kernels (RMSNorm sums
// squares in double; SwiGLU's exp is a 2-ulp polynomial), so results agree to ~1e-7 relative.
#include <algorithm>
#include <cmath>

#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12 AVX-512 headers: see matmul_fast.cc
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using simd::mask16;

constexpr int64_t kMinParallel = 1 << 15;  // elements: below this one thread is faster than waking the pool

ThreadPool* pool_for(ThreadPool* pool, int64_t elements) { return elements >= kMinParallel ? pool : nullptr; }

// y[i0..i1) rows of d: x * rsqrt(mean(x²) + eps) * w.
DC_TARGET_AVX512 void rms_norm_rows(const float* x, const float* w, int64_t i0, int64_t i1, int64_t d, float eps,
                                    float* y) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * d;
    float* yi = y + i * d;
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t t = 0; t < d; t += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(mask16(d - t), xi + t);
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
      const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
      s0 = _mm512_fmadd_pd(lo, lo, s0);
      s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    const double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(static_cast<float>(ss / d) + eps));
    for (int64_t t = 0; t < d; t += 16) {
      const __mmask16 m = mask16(d - t);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + t), r);
      _mm512_mask_storeu_ps(yi + t, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + t)));
    }
  }
}

// Rows [i0, i1) of x[n, n_heads, head_dim] rotated in place (rotate-half RoPE), by −θ when inverse.
DC_TARGET_AVX512 void rope_rows(float* x, int64_t i0, int64_t i1, int64_t n_heads, int64_t head_dim,
                                const float* cos, const float* sin, bool inverse) {
  const __m512 sign = _mm512_set1_ps(inverse ? -1.0f : 1.0f);
  const int64_t half = head_dim / 2;
  for (int64_t i = i0; i < i1; ++i) {
    const float* c = cos + i * half;
    const float* s = sin + i * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (i * n_heads + h) * head_dim;
      for (int64_t t = 0; t < half; t += 16) {
        const __mmask16 m = mask16(half - t);
        const __m512 x1 = _mm512_maskz_loadu_ps(m, v + t), x2 = _mm512_maskz_loadu_ps(m, v + half + t);
        const __m512 ct = _mm512_maskz_loadu_ps(m, c + t), st = _mm512_mul_ps(sign, _mm512_maskz_loadu_ps(m, s + t));
        _mm512_mask_storeu_ps(v + t, m, _mm512_sub_ps(_mm512_mul_ps(x1, ct), _mm512_mul_ps(x2, st)));
        _mm512_mask_storeu_ps(v + half + t, m, _mm512_add_ps(_mm512_mul_ps(x2, ct), _mm512_mul_ps(x1, st)));
      }
    }
  }
}

// out[b..e) = gate / (1 + e^-gate) * up.
DC_TARGET_AVX512 void swiglu_range(const float* gate, const float* up, int64_t b, int64_t e, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = b; i < e; i += 16) {
    const __mmask16 m = mask16(e - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, simd::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

DC_TARGET_AVX512 void add_range(float* y, const float* x, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; i += 16) {
    const __mmask16 m = mask16(e - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

// Lines [l0, l1) of 16 floats from the 64-byte aligned y, zeroed with streaming stores.
DC_TARGET_AVX512 void stream_zero_lines(float* y, int64_t l0, int64_t l1) {
  for (int64_t l = l0; l < l1; ++l) _mm512_stream_ps(y + 16 * l, _mm512_setzero_ps());
  _mm_sfence();  // the stores are visible before the pool reports the range done
}

}  // namespace

void rms_norm_fast(ThreadPool* pool, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) {
  if (!cpu_has_avx512()) return rms_norm(pool, x, w, n, d, eps, y);
  parallel_for(pool_for(pool, n * d), n, [&](int64_t b, int64_t e) { rms_norm_rows(x, w, b, e, d, eps, y); }, 4);
}

void rope_apply_fast(ThreadPool* pool, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                     const float* sin, bool inverse) {
  if (!cpu_has_avx512()) return rope_apply(pool, x, n, n_heads, head_dim, cos, sin, inverse);
  parallel_for(pool_for(pool, n * n_heads * head_dim), n,
               [&](int64_t b, int64_t e) { rope_rows(x, b, e, n_heads, head_dim, cos, sin, inverse); }, 4);
}

void swiglu_fast(ThreadPool* pool, const float* gate, const float* up, int64_t count, float* out) {
  if (!cpu_has_avx512()) return swiglu(pool, gate, up, count, out);
  // Chunks are whole multiples of 16 elements so only the last one is masked.
  const int64_t blocks = (count + 1023) / 1024;
  parallel_for(pool_for(pool, count), blocks, [&](int64_t b, int64_t e) {
    swiglu_range(gate, up, b * 1024, std::min(count, e * 1024), out);
  });
}

void add_inplace_fast(ThreadPool* pool, float* y, const float* x, int64_t count) {
  if (!cpu_has_avx512()) return add_inplace(pool, y, x, count);
  const int64_t blocks = (count + 1023) / 1024;
  parallel_for(pool_for(pool, count), blocks,
               [&](int64_t b, int64_t e) { add_range(y, x, b * 1024, std::min(count, e * 1024)); });
}

// Whole aligned 64-byte lines with streaming stores (no read for ownership: ~2x std::fill on 545 MB,
// an untied embedding table's gradient), the unaligned ends with plain stores.
void zero_fill_fast(ThreadPool* pool, float* y, int64_t count) {
  if (!cpu_has_avx512()) return zero_fill(pool, y, count);
  const int64_t head = std::min<int64_t>(count, (64 - reinterpret_cast<uintptr_t>(y) % 64) % 64 / 4);
  const int64_t lines = (count - head) / 16;
  std::fill(y, y + head, 0.0f);
  std::fill(y + head + 16 * lines, y + count, 0.0f);
  float* body = y + head;
  parallel_for(pool_for(pool, count), lines, [&](int64_t b, int64_t e) { stream_zero_lines(body, b, e); }, 4096);
}

}  // namespace dc::cpu
