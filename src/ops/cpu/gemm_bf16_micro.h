// The bf16 GEMM micro-kernels shared by matmul_nt_fast (matmul_fast.cc) and matmul_tn_add_fast
// (matmul_tn_fast.cc): c[rows, ≤ 64 columns] = init + a · b over bf16 pairs of k with f32 sums, b a
// packed panel (pair p of column c at word p · 64 + c), through AVX512_BF16 FMAs or AMX-BF16 tiles.
#pragma once

#include <cstdint>

#include "ops/cpu/simd_avx512.h"
#include "ops/weight.h"

// GCC 12's AVX-512 headers build some intrinsics on _mm*_undefined_*(), which -Wuninitialized flags
// once they are inlined into target("avx512...") functions: false positives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu::gemm {

using simd::mask16;

constexpr int kNv = 4;                  // 16-lane vectors of c columns per micro-tile
constexpr int64_t kPanel = kPanelRows;  // columns of c per packed panel = kNv · 16

enum class Init { kZero, kBias, kLoad };  // what the accumulators start from

template <int MR>
DC_TARGET_AVX512 DC_INLINE void init_acc(__m512 (&acc)[MR][kNv], const __mmask16 (&mk)[kNv], Init init,
                                         const float* bias, const float* c, int64_t ldc) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      if (init == Init::kLoad) acc[r][v] = _mm512_maskz_loadu_ps(mk[v], c + r * ldc + 16 * v);
      else if (init == Init::kBias) acc[r][v] = _mm512_maskz_loadu_ps(mk[v], bias + 16 * v);
      else acc[r][v] = _mm512_setzero_ps();
    }
}

template <int MR>
DC_TARGET_AVX512 DC_INLINE void store_acc(const __m512 (&acc)[MR][kNv], const __mmask16 (&mk)[kNv], float* c,
                                          int64_t ldc) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mk[v], acc[r][v]);
}

// c = init + a · b, a: [MR, kp] bf16 pairs (row stride lda pairs), b: [kp, 64] packed pairs.
template <int MR>
DC_TARGET_AVX512_BF16 void micro_bf16(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, float* c,
                                      int64_t ldc, int64_t cols, Init init, const float* bias) {
  __mmask16 mk[kNv];
  for (int v = 0; v < kNv; ++v) mk[v] = mask16(cols - 16 * v);
  __m512 acc[MR][kNv];
  init_acc<MR>(acc, mk, init, bias, c, ldc);
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + p * kPanel + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + p]));
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, bv[v]);
    }
  }
  store_acc<MR>(acc, mk, c, ldc);
}

// ---- AMX-BF16: c[32, cols ≤ 32] = init + a · b through 2 × 2 tiles of 16 × 16 f32 ----
// Tiles 0-3: c (rows 0-15 / 16-31 × columns 0-15 / 16-31), 4-5: a (16 rows × 16 pairs), 6-7: b (16 pairs ×
// 16 columns, read in place from a packed panel: row p of the tile is the panel's pair p, 64 words apart).

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row
  uint8_t rows[16] = {};
};

// Every tile 16 rows × 64 bytes. The configuration is per thread; each task sets it.
inline DC_TARGET_AMX void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

inline DC_TARGET_AMX void amx_release() { _tile_release(); }

// c = init + a · b for 32 rows × `cols` (≤ 32) columns; kp (pairs) a multiple of 16. a: [32, kp] pairs
// (row stride lda words), b: the panel at its first column of interest (pair stride 64 words).
inline DC_TARGET_AMX void micro_amx(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, float* c, int64_t ldc,
                             int64_t cols, Init init, const float* bias) {
  alignas(64) float tmp[32 * 32];  // c through memory when it is not a whole 32 × 32 block or starts at bias
  const bool direct = cols == 32 && init != Init::kBias;
  if (init == Init::kZero) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else if (direct) {
    _tile_loadd(0, c, ldc * 4);
    _tile_loadd(1, c + 16, ldc * 4);
    _tile_loadd(2, c + 16 * ldc, ldc * 4);
    _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  } else {
    for (int r = 0; r < 32; ++r)
      for (int t = 0; t < 32; ++t)
        tmp[r * 32 + t] = t >= cols ? 0.0f : init == Init::kBias ? bias[t] : c[r * ldc + t];
    _tile_loadd(0, tmp, 128);
    _tile_loadd(1, tmp + 16, 128);
    _tile_loadd(2, tmp + 512, 128);
    _tile_loadd(3, tmp + 528, 128);
  }
  for (int64_t p = 0; p < kp; p += 16) {
    _tile_loadd(4, a + p, lda * 4);
    _tile_loadd(5, a + 16 * lda + p, lda * 4);
    _tile_loadd(6, b + p * kPanel, kPanel * 4);
    _tile_loadd(7, b + p * kPanel + 16, kPanel * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  if (direct) {
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
    return;
  }
  _tile_stored(0, tmp, 128);
  _tile_stored(1, tmp + 16, 128);
  _tile_stored(2, tmp + 512, 128);
  _tile_stored(3, tmp + 528, 128);
  for (int r = 0; r < 32; ++r)
    for (int t = 0; t < cols; ++t) c[r * ldc + t] = tmp[r * 32 + t];
}

}  // namespace dc::cpu::gemm

#pragma GCC diagnostic pop
