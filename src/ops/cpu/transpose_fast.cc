// Fast transposes of f32 matrices for the matmul backward (dyᵀ, xᵀ, wᵀ): 16×16 blocks through
// registers (simd::transpose16x16_epi32), stored as f32 or rounded to bf16 (round to nearest even).
// Pure data movement: the same values as the reference loops (elementwise_backward.cc, ops/backward.cc).
#include <algorithm>

#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

// y[c, r] = x[r, c] for the block of rows [r0, r0 + 16) and columns [c0, c0 + 16) (clipped to the matrix).
template <bool kBf16>
DC_TARGET_AVX512_BF16 void transpose_block(const float* x, int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                                           void* y) {
  const int64_t nr = std::min<int64_t>(16, rows - r0), nc = std::min<int64_t>(16, cols - c0);
  const __mmask16 col_mask = simd::mask16(nc), row_mask = simd::mask16(nr);
  __m512i r[16];
  for (int64_t i = 0; i < 16; ++i)
    r[i] = i < nr ? _mm512_castps_si512(_mm512_maskz_loadu_ps(col_mask, x + (r0 + i) * cols + c0))
                  : _mm512_setzero_si512();
  simd::transpose16x16_epi32(r);  // r[c] lane i = x[r0 + i, c0 + c]
  for (int64_t c = 0; c < nc; ++c) {
    if constexpr (kBf16) {
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(r[c]));
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + (c0 + c) * rows + r0, row_mask, h);
    } else {
      _mm512_mask_storeu_ps(static_cast<float*>(y) + (c0 + c) * rows + r0, row_mask, _mm512_castsi512_ps(r[c]));
    }
  }
}

template <bool kBf16>
void transpose_blocks(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, void* y) {
  parallel_for(pool, (rows + 15) / 16, [&](int64_t b, int64_t e) {
    for (int64_t rb = b; rb < e; ++rb)
      for (int64_t c0 = 0; c0 < cols; c0 += 16) transpose_block<kBf16>(x, rows, cols, rb * 16, c0, y);
  }, 4);
}

}  // namespace

void transpose_fast(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, float* y) {
  if (!cpu_has_avx512()) return transpose(pool, x, rows, cols, y);
  transpose_blocks<false>(pool, x, rows, cols, y);
}

void transpose_bf16_fast(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, uint16_t* y) {
  transpose_blocks<true>(pool, x, rows, cols, y);
}

}  // namespace dc::cpu
