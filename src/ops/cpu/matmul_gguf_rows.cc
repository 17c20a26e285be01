// matmul_nt over ggml block weights for a few rows of x (matmul_gguf.h, GgufPath::kRows): ggml's vec_dot
// shape. Each weight row is read once, 256 columns (a super block: one K-quant block, or eight 32-value
// blocks) at a time, decoded straight into four 64-byte vectors of u8 codes in column order plus one f32
// scale and offset vector over its 16 groups of 16 columns; then for every row of x, per 64 columns one
// vpdpbusd gives 16 lanes of 4-product int32 sums, and lane l of vector c belongs to group 4c + l/4:
//   acc += f32(Σ c·xq) · (s·sx)[group of lane]  (one permute of the group vector per 64 columns)
//   acc += o · sxs                               (per super block: the offsets against sx·Σ xq)
// and y[i, j] is the horizontal sum of acc. No panel buffer, no transpose: the decode costs one pass of
// registers per weight, which is what a decode step (n = 1) or a handful of rows can afford.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/gguf_blocks.h"
#include "ops/cpu/gguf_codes_simd.h"
#include "ops/cpu/matmul_gguf.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using gguf_codes::bits;
using gguf_codes::load256;

constexpr int64_t kSuper = 256;   // columns per super block
constexpr int kMaxRowTile = 4;    // rows of x per pass over a weight row (8: not measured apart from noise)

// One super block decoded: codes of columns [64c, 64c + 64) in c[c] (column order), and per group of 16
// columns g the scale sc[g] and offset of[g] (value = sc·code + of).
struct Super {
  __m512i c[4];
  __m512 sc, of;
};

DC_TARGET_VNNI inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
DC_TARGET_VNNI inline __m512 f16_lanes(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }  // low halves

// The 32 codes of one 32-value block at b (Q8_0: q + 128; Q4_x: the nibble; Q5_x: the nibble | fifth bit << 4).
template <GgmlType t>
DC_TARGET_VNNI inline __m256i codes32(const uint8_t* b) {
  if constexpr (t == GgmlType::kQ8_0) {
    return _mm256_xor_si256(load256(b + 2), _mm256_set1_epi8(static_cast<char>(0x80)));
  } else {
    constexpr bool kFive = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1;
    constexpr int kAfter = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1 ? 4 : 2;
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kAfter + (kFive ? 4 : 0))));
    // values 0..15: the low nibbles; 16..31: the high ones
    __m256i v = _mm256_and_si256(_mm256_blend_epi32(q, _mm256_srli_epi16(q, 4), 0xF0), _mm256_set1_epi8(0x0f));
    if constexpr (kFive) {
      uint32_t qh;
      std::memcpy(&qh, b + kAfter, 4);
      v = _mm256_or_si256(v, _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)));
    }
    return v;
  }
}

// Eight 32-value blocks from src (each `kBytes` long). Their d (and m): the blocks' first 4 bytes, each
// block's in two lanes (its two groups); a vpgatherdd there took 30 % of the kernel's time (Zen 4).
template <GgmlType t>
DC_TARGET_VNNI inline void decode_super32(const uint8_t* src, Super& s) {
  constexpr int kBytes = static_cast<int>(t == GgmlType::kQ8_0 ? 34 : t == GgmlType::kQ4_0 ? 18 : t == GgmlType::kQ4_1 ? 20
                                          : t == GgmlType::kQ5_0 ? 22 : 24);
  for (int c = 0; c < 4; ++c) s.c[c] = join(codes32<t>(src + 2 * c * kBytes), codes32<t>(src + (2 * c + 1) * kBytes));
  alignas(32) uint32_t head[8];  // each block's first 4 bytes: d (and m)
  for (int b = 0; b < 8; ++b) std::memcpy(&head[b], src + b * kBytes, 4);
  const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i dm = _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(head))));
  s.sc = f16_lanes(dm);
  if constexpr (t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1) {
    s.of = f16_lanes(_mm512_srli_epi32(dm, 16));
  } else {
    constexpr float kBias = t == GgmlType::kQ8_0 ? -128.0f : t == GgmlType::kQ5_0 ? -16.0f : -8.0f;
    s.of = _mm512_mul_ps(s.sc, _mm512_set1_ps(kBias));
  }
}

DC_TARGET_VNNI inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Q4_K / Q5_K: the 8 6-bit scales and mins of the 12 packed bytes at q (ggml's kmask unpacking), each
// repeated for the two groups of its 32-column sub-block.
DC_TARGET_VNNI inline void k4_scales(const uint8_t* b, Super& s) {
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  constexpr uint32_t kM1 = 0x3f3f3f3f, kM2 = 0x0f0f0f0f, kM3 = 0x03030303;
  u[3] = ((u[2] >> 4) & kM2) | (((u[1] >> 6) & kM3) << 4);
  const uint32_t mins_lo = u[1] & kM1;
  u[1] = (u[2] & kM2) | (((u[0] >> 6) & kM3) << 4);
  u[2] = mins_lo;
  u[0] &= kM1;
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));  // scales bytes 0..7, mins 8..15
  const __m128i sc = _mm_unpacklo_epi8(v, v), mn = _mm_unpackhi_epi8(v, v);
  s.sc = _mm512_mul_ps(_mm512_set1_ps(f16_at(b)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
  s.of = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 2)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn))));
}

// One K-quant block (256 values) at b.
template <GgmlType t>
DC_TARGET_VNNI inline void decode_super_k(const uint8_t* b, Super& s) {
  if constexpr (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) {
    __m256i lo[4], hi[4];
    gguf_codes::k4_codes<t>(b, lo, hi);
    for (int c = 0; c < 4; ++c) s.c[c] = join(lo[c], hi[c]);  // sub-blocks 2c and 2c + 1
    k4_scales(b, s);
  } else if constexpr (t == GgmlType::kQ6_K) {
    __m256i codes[8];
    gguf_codes::q6k_codes(b, codes);
    for (int c = 0; c < 4; ++c) s.c[c] = join(codes[2 * c], codes[2 * c + 1]);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    s.sc = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)));
    s.of = _mm512_mul_ps(s.sc, _mm512_set1_ps(-32.0f));
  } else {  // Q2_K, Q3_K: value 128h + 32j + l at bits 2j of qs[32h + l]
    constexpr bool kQ3 = t == GgmlType::kQ3_K;
    const __m256i hm = kQ3 ? load256(b) : _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(b + (kQ3 ? 32 : 16) + 32 * h);
      __m256i v[4];
      for (int j = 0; j < 4; ++j) {
        v[j] = bits(q, 2 * j, 3);
        if (kQ3) v[j] = _mm256_or_si256(v[j], _mm256_slli_epi16(bits(hm, 4 * h + j, 1), 2));
      }
      s.c[2 * h] = join(v[0], v[1]);
      s.c[2 * h + 1] = join(v[2], v[3]);
    }
    if constexpr (kQ3) {  // 6-bit s: low 4 bits in the nibbles of bytes 0..7, high 2 bits of group i at
                          // bits 2·(i/4) of byte 8 + i%4
      const __m128i l8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 96));
      const __m128i m4 = _mm_set1_epi8(0x0f);
      const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(l8, m4), _mm_and_si128(_mm_srli_epi16(l8, 4), m4));
      uint32_t h4;
      std::memcpy(&h4, b + 104, 4);
      const __m512i high = _mm512_and_si512(
          _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_set1_epi32(static_cast<int>(h4))),
                            _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0)),
          _mm512_set1_epi32(3));
      const __m512i sv = _mm512_sub_epi32(_mm512_or_si512(_mm512_cvtepu8_epi32(low), _mm512_slli_epi32(high, 4)),
                                          _mm512_set1_epi32(32));
      s.sc = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 108)), _mm512_cvtepi32_ps(sv));
      s.of = _mm512_mul_ps(s.sc, _mm512_set1_ps(-4.0f));
    } else {
      const __m512i sv = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
      s.sc = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 80)), _mm512_cvtepi32_ps(_mm512_and_si512(sv, _mm512_set1_epi32(15))));
      s.of = _mm512_sub_ps(_mm512_setzero_ps(),
                           _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 82)), _mm512_cvtepi32_ps(_mm512_srli_epi32(sv, 4))));
    }
  }
}

template <GgmlType t>
DC_TARGET_VNNI inline void decode_super(const uint8_t* src, Super& s) {
  if constexpr (ggml_block_values(t) == 32) {
    decode_super32<t>(src, s);
  } else {
    decode_super_k<t>(src, s);
  }
}

// acc += the super block's products with x row xq (its 256 columns at xq), sx / sxs its 16 groups';
// `cols` < 256 (a 32-value type's last super block): columns past it count zero (their scale and offset
// are zero, and x is not read there).
DC_TARGET_VNNI inline __m512 super_dot(const Super& s, const int8_t* xq, const float* sx, const float* sxs, int64_t cols,
                                       __m512 acc) {
  const __mmask16 groups = static_cast<__mmask16>((1u << (cols / 16)) - 1);  // cols ≤ 256
  const __m512 ssx = _mm512_mul_ps(s.sc, _mm512_maskz_loadu_ps(groups, sx));
  __m512 part = _mm512_maskz_mul_ps(groups, s.of, _mm512_maskz_loadu_ps(groups, sxs));
  for (int c = 0; c < 4; ++c) {
    const int64_t left = cols - 64 * c;
    if (left <= 0) break;
    const __m512i xv = left >= 64 ? _mm512_loadu_si512(xq + 64 * c)
                                  : _mm512_maskz_loadu_epi8((uint64_t{1} << left) - 1, xq + 64 * c);
    const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), s.c[c], xv);
    const __m512i lane_group = _mm512_add_epi32(_mm512_set1_epi32(4 * c),
                                                _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2));
    part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lane_group, ssx), part);
  }
  return _mm512_add_ps(acc, part);
}

// Weight rows [j0, j1) against x rows [i0, i0 + R): y[i, j] = Σ over the row's super blocks, + bias[j].
template <GgmlType t, int R>
DC_TARGET_VNNI void rows_tile(const GgufQuantizedX& xq, int64_t i0, const WeightView& w, int64_t j0, int64_t j1,
                              const float* bias, float* y) {
  const int64_t k = w.cols, m = w.rows, groups = k / kGgufXGroup;
  const GgmlBlockInfo info = ggml_block_info(t);
  const int64_t row_bytes = ggml_row_bytes(t, k), super_bytes = kSuper / info.values * info.bytes;
  const int64_t full = k / kSuper, tail = k % kSuper;  // tail: 32-value types only, a multiple of 32
  alignas(64) uint8_t tail_blocks[8 * 34];
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * row_bytes;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    Super s;
    for (int64_t sb = 0; sb < full; ++sb) {
      decode_super<t>(row + sb * super_bytes, s);
      for (int r = 0; r < R; ++r) {
        const int64_t i = i0 + r;
        acc[r] = super_dot(s, xq.q + i * k + sb * kSuper, xq.sx + i * groups + sb * 16, xq.sxs + i * groups + sb * 16,
                           kSuper, acc[r]);
      }
    }
    if (tail > 0) {  // the last tail/32 blocks, copied after zeroed ones' room: d = 0 past them
      std::memset(tail_blocks, 0, sizeof(tail_blocks));
      std::memcpy(tail_blocks, row + full * super_bytes, static_cast<size_t>(tail / 32 * info.bytes));
      decode_super<t>(tail_blocks, s);
      for (int r = 0; r < R; ++r) {
        const int64_t i = i0 + r;
        acc[r] = super_dot(s, xq.q + i * k + full * kSuper, xq.sx + i * groups + full * 16,
                           xq.sxs + i * groups + full * 16, tail, acc[r]);
      }
    }
    const float b = bias != nullptr ? bias[j] : 0.0f;
    for (int r = 0; r < R; ++r) y[(i0 + r) * m + j] = _mm512_reduce_add_ps(acc[r]) + b;
  }
}

template <GgmlType t, int R = kMaxRowTile>
DC_TARGET_VNNI void rows_tile_of(int rows, const GgufQuantizedX& xq, int64_t i0, const WeightView& w, int64_t j0,
                                 int64_t j1, const float* bias, float* y) {
  if constexpr (R > 1) {
    if (rows < R) return rows_tile_of<t, R - 1>(rows, xq, i0, w, j0, j1, bias, y);
  }
  rows_tile<t, R>(xq, i0, w, j0, j1, bias, y);
}

template <GgmlType t>
DC_TARGET_VNNI void rows_all_x(const GgufQuantizedX& xq, int64_t n, const WeightView& w, int64_t j0, int64_t j1,
                               const float* bias, float* y) {
  // x rows in tiles of near-equal height (≤ kMaxRowTile), each a pass over the weight rows [j0, j1)
  const int64_t tiles = (n + kMaxRowTile - 1) / kMaxRowTile, base = n / tiles, extra = n % tiles;
  int64_t i = 0;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int rows = static_cast<int>(base + (tile < extra ? 1 : 0));
    rows_tile_of<t>(rows, xq, i, w, j0, j1, bias, y);
    i += rows;
  }
}

}  // namespace

void matmul_nt_gguf_rows_vnni(ThreadPool* pool, const GgufQuantizedX& xq, int64_t n, const WeightView& w,
                              const float* bias, float* y) {
  // 64 weight rows per task at least: a task's rows are one sequential stream of the file's bytes; with
  // more than one tile of x rows, each 16 weight rows are read again per tile from L2 (16 rows of k = 18944
  // in Q8_0: 320 KiB), not from memory
  constexpr int64_t kRowsPerTile = 16;
  parallel_for(pool, w.rows, [&](int64_t j0, int64_t j1) {
    for (int64_t a = j0; a < j1; a += kRowsPerTile) {
      const int64_t b = std::min(j1, a + kRowsPerTile);
      switch (w.ggml_type) {
#define DC_ROWS(T) \
  case GgmlType::T: rows_all_x<GgmlType::T>(xq, n, w, a, b, bias, y); break;
        DC_ROWS(kQ4_0) DC_ROWS(kQ4_1) DC_ROWS(kQ5_0) DC_ROWS(kQ5_1) DC_ROWS(kQ8_0)
        DC_ROWS(kQ2_K) DC_ROWS(kQ3_K) DC_ROWS(kQ4_K) DC_ROWS(kQ5_K) DC_ROWS(kQ6_K)
#undef DC_ROWS
        case GgmlType::kNone: break;
      }
    }
  }, 64);
}

}  // namespace dc::cpu
