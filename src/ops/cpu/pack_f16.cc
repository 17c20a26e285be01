// pack_f16.h: f16 weight blocks split into bf16 hi / lo pair panels for the bf16 GEMM.
// GCC 12's AVX-512 headers write their "undefined" operands as `__m512i __Y = __Y;`, which
// -Wmaybe-uninitialized reports at each intrinsic inlined here (74 false warnings per build).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "ops/cpu/pack_f16.h"

#include <algorithm>

#include "ops/cpu/gemm_bf16_micro.h"
#include "ops/cpu/simd_avx512.h"

namespace dc::cpu {
namespace {

// 32 bf16 (a __m512i) back to f32: the low 16 and the high 16.
DC_TARGET_AVX512 DC_INLINE __m512 widen_bf16_lo(__m512i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
}
DC_TARGET_AVX512 DC_INLINE __m512 widen_bf16_hi(__m512i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
}

}  // namespace

DC_TARGET_AVX512_BF16 void pack_pairs_f16_split(const uint16_t* w, int64_t ldw, int64_t nj, int64_t k0, int64_t kc,
                                                const uint16_t* next, uint32_t* hi, uint32_t* lo) {
  using gemm::kNv;
  using gemm::kPanel;
  const int64_t kp = (kc + 1) / 2;
  for (int v = 0; v < kNv; ++v) {
    for (int64_t pp = 0; pp < kp; pp += 16) {  // 16 rows × 16 pairs (32 values of k) per transpose
      const __mmask32 m = simd::mask32(kc - 2 * pp);
      __m512i rh[16], rl[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t row = 16 * v + i;
        if (next) _mm_prefetch(reinterpret_cast<const char*>(next + row * ldw + 2 * pp), _MM_HINT_T1);
        const __m512i h = row < nj ? _mm512_maskz_loadu_epi16(m, w + row * ldw + k0 + 2 * pp) : _mm512_setzero_si512();
        const __m512 a = _mm512_cvtph_ps(_mm512_castsi512_si256(h));       // k 0..15 of this slice
        const __m512 b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));  // k 16..31
        rh[i] = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        rl[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, widen_bf16_hi(rh[i])),
                                             _mm512_sub_ps(a, widen_bf16_lo(rh[i])));
      }
      simd::transpose16x16_epi32(rh);
      simd::transpose16x16_epi32(rl);
      const int64_t np = std::min<int64_t>(16, kp - pp);
      for (int64_t t = 0; t < np; ++t) {
        _mm512_store_si512(hi + (pp + t) * kPanel + 16 * v, rh[t]);
        _mm512_store_si512(lo + (pp + t) * kPanel + 16 * v, rl[t]);
      }
    }
  }
}

}  // namespace dc::cpu
