// AVX-512 building blocks shared by the fast CPU kernels: target attributes, a 16×16 transpose of
// 32-bit lanes, a vectorised expf, column masks, rows rounded to bf16. Only call these from functions compiled with the
// same (or a wider) target attribute, and only after cpu_has_avx512() said yes (ops/cpu/kernels.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

// Functions using AVX-512F/BW/VL/DQ (+FMA, F16C conversions).
#define DC_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
// ... plus the bf16 dot product (vdpbf16ps) and conversions (vcvtne2ps2bf16).
#define DC_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
// ... plus the AMX tiles and their bf16 dot product (tdpbf16ps).
#define DC_TARGET_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,amx-tile,amx-bf16")))
#define DC_INLINE inline __attribute__((always_inline))

namespace dc::cpu::simd {

// The low `count` bits set (count clamped to [0, 16]): lanes of a 16-lane vector that are in range.
inline __mmask16 mask16(int64_t count) {
  if (count >= 16) return static_cast<__mmask16>(0xffff);
  if (count <= 0) return 0;
  return static_cast<__mmask16>((1u << count) - 1);
}

// The low `count` bits set (count clamped to [0, 32]).
inline __mmask32 mask32(int64_t count) {
  if (count >= 32) return 0xffffffffu;
  if (count <= 0) return 0;
  return (1u << count) - 1;
}

// In place: r[i] lane j  <-  r[j] lane i, for 16 vectors of 16 32-bit lanes.
DC_TARGET_AVX512 DC_INLINE void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {  // 2×2 blocks of 32-bit elements within each 128-bit lane
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[g][c] (stored at r[4g + c]): lane L holds rows 4g..4g+3 of column 4L + c.
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // 4×4 transpose of 128-bit blocks among u[0][c], u[1][c], u[2][c], u[3][c]: output row 4L + c.
  for (int c = 0; c < 4; ++c) {
    const __m512i a = r[c], b = r[4 + c], cc = r[8 + c], d = r[12 + c];
    const __m512i x0 = _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i x1 = _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i y0 = _mm512_shuffle_i32x4(cc, d, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i y1 = _mm512_shuffle_i32x4(cc, d, _MM_SHUFFLE(3, 2, 3, 2));
    t[c] = _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + c] = _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + c] = _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + c] = _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];  // t[4L + c] is output row 4L + c
}

// e^x per lane for x <= 88.7 (larger x overflows to +inf); x < -87.3 (and -inf) gives exactly 0.
// Cody-Waite range reduction x = n·ln2 + r, |r| <= ln2/2, degree-6 polynomial: max error ~2 ulp.
DC_TARGET_AVX512 DC_INLINE __m512 exp_ps(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  // e^r = 1 + r + r²·P(r) (Cephes expf coefficients).
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);  // p · 2^n
}

// dst[0, ld) = src[0, n) rounded to bf16 (round to nearest even), zero past n; ld a multiple of 32.
DC_TARGET_AVX512_BF16 DC_INLINE void round_row_bf16(const float* src, int64_t n, int64_t ld, uint16_t* dst) {
  for (int64_t t = 0; t < ld; t += 32) {
    const __m512 lo = _mm512_maskz_loadu_ps(mask16(n - t), src + t);
    const __m512 hi = _mm512_maskz_loadu_ps(mask16(n - t - 16), src + t + 16);
    _mm512_storeu_si512(dst + t, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

}  // namespace dc::cpu::simd
