// matmul_nt over ggml block weights (matmul_gguf.h): x rounded to int8 per 16 columns; each 32-row panel of
// W decoded chunk by chunk into u8 codes laid out as the q8 kernel's kPanels (one 64-byte vector holds 4
// consecutive codes of 16 rows, lane = weight row), so that one broadcast of 4 bytes of x feeds 16 rows
// through vpdpbusd; per 16 columns the exact int32 sums become f32 once: y += s·sx·Σ c·xq + o·sx·Σ xq.
// The panel is decoded once per chunk and read by every row of x (the whole batch), so decoding costs
// per weight, not per product. This file is the kPanels path and the entry point; up to kGgufRowsMaxN rows
// of x go to the kRows path (matmul_gguf_rows.cc), which needs no panel buffer and no transpose.
#include "ops/cpu/matmul_gguf.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "ops/cpu/gguf_blocks.h"
#include "ops/cpu/gguf_codes_simd.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using gguf_codes::bits;
using gguf_codes::load256;

constexpr int64_t kG = kGgufXGroup;  // columns per x scale and per weight scale / offset
static_assert(kG == kGgmlGroup);
constexpr int64_t kRows = 32;     // weight rows per panel: two vectors of 16 lanes
constexpr int64_t kChunk = 1024;  // columns decoded at a time (a multiple of every block): 32 KiB of codes
constexpr int kMaxTile = 6;       // rows of x per register tile (12 int32 + 12 f32 accumulators)

using QuantizedX = GgufQuantizedX;

DC_TARGET_VNNI void quantize_x(const float* x, int64_t k, int64_t i0, int64_t i1, int8_t* q, float* sx, float* sxs) {
  const int64_t groups = k / kG;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 a = _mm512_loadu_ps(x + i * k + g * kG);
      const float mx = _mm512_reduce_max_ps(_mm512_abs_ps(a)), s = mx / 127.0f;
      const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(mx > 0 ? 127.0f / mx : 0.0f)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * k + g * kG), _mm512_cvtsepi32_epi8(qi));
      sx[i * groups + g] = s;
      sxs[i * groups + g] = s * static_cast<float>(_mm512_reduce_add_epi32(qi));
    }
}

// The codes of `n_blocks` blocks of `t` at src into out[n_blocks · values] (ggml_decode_u8's codes, in
// vector registers: the scalar form is gguf_blocks.cc's, the oracle of the tests).
template <GgmlType t>
DC_TARGET_VNNI void decode_codes(const uint8_t* src, int64_t n_blocks, uint8_t* out) {
  const GgmlBlockInfo info = ggml_block_info(t);
  const __m128i low4 = _mm_set1_epi8(0x0f), bit4 = _mm_set1_epi8(0x10);
  const __m256i three = _mm256_set1_epi8(3);
  auto load128 = [](const uint8_t* p) DC_TARGET_VNNI { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  auto store128 = [](uint8_t* p, __m128i v) DC_TARGET_VNNI { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); };
  auto store256 = [](uint8_t* p, __m256i v) DC_TARGET_VNNI { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); };
  for (int64_t blk = 0; blk < n_blocks; ++blk, src += info.bytes, out += info.values) {
    switch (t) {  // a constant: one case is compiled per type
      case GgmlType::kQ8_0:
        store256(out, _mm256_xor_si256(load256(src + 2), _mm256_set1_epi8(static_cast<char>(0x80))));
        break;
      case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1: {
        const bool five = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1, with_m = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
        const uint8_t* after = src + (with_m ? 4 : 2);
        const __m128i q = load128(after + (five ? 4 : 0));
        __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
        if (five) {
          uint32_t qh;
          std::memcpy(&qh, after, 4);
          lo = _mm_or_si128(lo, _mm_maskz_mov_epi8(static_cast<__mmask16>(qh & 0xffff), bit4));
          hi = _mm_or_si128(hi, _mm_maskz_mov_epi8(static_cast<__mmask16>(qh >> 16), bit4));
        }
        store128(out, lo);
        store128(out + 16, hi);
        break;
      }
      case GgmlType::kQ4_K: case GgmlType::kQ5_K:
        if constexpr (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) {
          __m256i lo[4], hi[4];
          gguf_codes::k4_codes<t>(src, lo, hi);
          for (int c = 0; c < 4; ++c) {  // sub-blocks 2c and 2c + 1
            store256(out + 64 * c, lo[c]);
            store256(out + 64 * c + 32, hi[c]);
          }
        }
        break;
      case GgmlType::kQ6_K: {
        __m256i codes[8];
        gguf_codes::q6k_codes(src, codes);
        for (int j = 0; j < 8; ++j) store256(out + 32 * j, codes[j]);
        break;
      }
      case GgmlType::kQ2_K: case GgmlType::kQ3_K: {
        const bool q3 = t == GgmlType::kQ3_K;
        const __m256i hm = q3 ? load256(src) : _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
          const __m256i q = load256(src + (q3 ? 32 : 16) + 32 * h);
          for (int j = 0; j < 4; ++j) {
            __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three);
            if (q3) v = _mm256_or_si256(v, _mm256_slli_epi16(bits(hm, 4 * h + j, 1), 2));
            store256(out + 128 * h + 32 * j, v);
          }
        }
        break;
      }
      case GgmlType::kNone: break;
    }
  }
}

// The 32-value types' scale and offset (both 16-column halves alike) with F16C's conversion inline: per
// 32 values, ggml_block_scales' call and switch were half of the decoding time.
template <GgmlType t>
DC_TARGET_VNNI void block_scales(const uint8_t* b, float* sc, float* of) {
  if constexpr (ggml_block_values(t) == 32) {
    uint16_t h[2];
    std::memcpy(h, b, 4);
    const float d = _cvtsh_ss(h[0]);
    constexpr bool kWithM = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
    constexpr float kBias = t == GgmlType::kQ8_0 ? -128.0f : t == GgmlType::kQ5_0 ? -16.0f : -8.0f;
    sc[0] = sc[1] = d;
    of[0] = of[1] = kWithM ? _cvtsh_ss(h[1]) : kBias * d;
  } else {
    ggml_block_scales(t, b, sc, of);
  }
}

// Row l of the panel, blocks [b0, b0 + n_blocks) of its row at src: codes into rows + l·kChunk, scale and
// offset into the [group][32] tables.
template <GgmlType t>
DC_TARGET_VNNI void decode_row(const uint8_t* src, int64_t n_blocks, int l, uint8_t* rows, float* scale, float* offset) {
  constexpr int64_t kValues = ggml_block_values(t), kGroups = kValues / kG;
  const int64_t bytes = ggml_block_info(t).bytes;
  decode_codes<t>(src, n_blocks, rows + l * kChunk);
  float sc[16], of[16];
  for (int64_t b = 0; b < n_blocks; ++b) {
    block_scales<t>(src + b * bytes, sc, of);
    for (int64_t g = 0; g < kGroups; ++g) {
      scale[(b * kGroups + g) * kRows + l] = sc[g];
      offset[(b * kGroups + g) * kRows + l] = of[g];
    }
  }
}

// Panel rows [j0, j0 + 32) (past m: the last row again), columns [c0, c0 + cw) decoded into codes
// [cw/4 steps][2 vectors][16 lanes × 4 bytes] and scale / offset [cw/16][32].
struct PanelScratch {
  uint8_t* codes;     // [kChunk / 4][128], 64-byte aligned
  float* scale;       // [kChunk / 16][32]
  float* offset;      // [kChunk / 16][32]
  uint8_t* rows;      // [32][kChunk] the rows' codes, row-major
};

DC_TARGET_VNNI void decode_panel(const WeightView& w, int64_t row_bytes, int64_t j0, int64_t c0, int64_t cw,
                                 const PanelScratch& s) {
  const GgmlBlockInfo info = ggml_block_info(w.ggml_type);
  const int64_t n_blocks = cw / info.values;
  for (int l = 0; l < kRows; ++l) {
    const int64_t r = std::min(j0 + l, w.rows - 1);
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * row_bytes + c0 / info.values * info.bytes;
    switch (w.ggml_type) {
#define DC_DECODE_ROW(T) \
  case GgmlType::T: decode_row<GgmlType::T>(src, n_blocks, l, s.rows, s.scale, s.offset); break;
      DC_DECODE_ROW(kQ4_0) DC_DECODE_ROW(kQ4_1) DC_DECODE_ROW(kQ5_0) DC_DECODE_ROW(kQ5_1) DC_DECODE_ROW(kQ8_0)
      DC_DECODE_ROW(kQ2_K) DC_DECODE_ROW(kQ3_K) DC_DECODE_ROW(kQ4_K) DC_DECODE_ROW(kQ5_K) DC_DECODE_ROW(kQ6_K)
#undef DC_DECODE_ROW
      case GgmlType::kNone: break;
    }
  }
  // 16 rows × 64 columns (16 words of 4 codes each) at a time: a 16×16 transpose of 32-bit words turns
  // row l's word t into lane l of step t.
  const int64_t steps = cw / 4;
  for (int v = 0; v < 2; ++v)
    for (int64_t q = 0; q < (cw + 63) / 64; ++q) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(s.rows + (16 * v + i) * kChunk + 64 * q);
      simd::transpose16x16_epi32(r);
      for (int t = 0; t < 16 && 16 * q + t < steps; ++t) _mm512_store_si512(s.codes + (16 * q + t) * 128 + v * 64, r[t]);
    }
}

// y rows [i0, i0 + R), the panel's 32 columns, over the decoded chunk [c0, c0 + cw): accumulates in
// registers, then stores (first chunk) or adds into y, and adds the bias after the last chunk.
template <int R>
DC_TARGET_VNNI void panel_tile(const QuantizedX& xq, int64_t i0, const PanelScratch& s, int64_t c0, int64_t cw,
                               bool first, bool last, const float* bias, float* y, int64_t m, int64_t j0) {
  const int64_t groups = xq.k / kG;
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < cw / kG; ++g) {
    __m512i dot[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm512_setzero_si512();
    const int8_t* xg = xq.q + i0 * xq.k + c0 + g * kG;
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const __m512i w0 = _mm512_load_si512(s.codes + (4 * g + t) * 128);
      const __m512i w1 = _mm512_load_si512(s.codes + (4 * g + t) * 128 + 64);
      for (int r = 0; r < R; ++r) {
        int32_t x4;
        std::memcpy(&x4, xg + r * xq.k + 4 * t, 4);
        const __m512i xv = _mm512_set1_epi32(x4);
        dot[r][0] = _mm512_dpbusd_epi32(dot[r][0], w0, xv);
        dot[r][1] = _mm512_dpbusd_epi32(dot[r][1], w1, xv);
      }
    }
    const __m512 sc[2] = {_mm512_load_ps(s.scale + g * kRows), _mm512_load_ps(s.scale + g * kRows + 16)};
    const __m512 of[2] = {_mm512_load_ps(s.offset + g * kRows), _mm512_load_ps(s.offset + g * kRows + 16)};
    const int64_t xg_index = (c0 / kG + g);
    for (int r = 0; r < R; ++r) {
      const __m512 sx = _mm512_set1_ps(xq.sx[(i0 + r) * groups + xg_index]);
      const __m512 sxs = _mm512_set1_ps(xq.sxs[(i0 + r) * groups + xg_index]);
      for (int v = 0; v < 2; ++v) {
        acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][v]), _mm512_mul_ps(sc[v], sx), acc[r][v]);
        acc[r][v] = _mm512_fmadd_ps(of[v], sxs, acc[r][v]);
      }
    }
  }
  for (int v = 0; v < 2; ++v) {
    const __mmask16 keep = simd::mask16(m - j0 - 16 * v);
    const __m512 bv = last && bias != nullptr ? _mm512_maskz_loadu_ps(keep, bias + j0 + 16 * v) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      float* p = y + (i0 + r) * m + j0 + 16 * v;
      const __m512 before = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(keep, p);
      _mm512_mask_storeu_ps(p, keep, _mm512_add_ps(_mm512_add_ps(before, acc[r][v]), bv));
    }
  }
}

template <int R = kMaxTile>
DC_TARGET_VNNI void tile_rows(int rows, const QuantizedX& xq, int64_t i0, const PanelScratch& s, int64_t c0, int64_t cw,
                              bool first, bool last, const float* bias, float* y, int64_t m, int64_t j0) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<R - 1>(rows, xq, i0, s, c0, cw, first, last, bias, y, m, j0);
  }
  panel_tile<R>(xq, i0, s, c0, cw, first, last, bias, y, m, j0);
}

}  // namespace

void matmul_nt_gguf_vnni(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                         const float* bias, float* y, GgufPath path) {
  const int64_t m = w.rows, k = w.cols, groups = k / kG;
  const size_t q_bytes = static_cast<size_t>(n * k + 63) & ~size_t{63};
  char* xbuf = ws.thread_buffer<char>("matmul_gguf.x", q_bytes + 2 * static_cast<size_t>(n * groups) * sizeof(float));
  auto* xq8 = reinterpret_cast<int8_t*>(xbuf);
  auto* sx = reinterpret_cast<float*>(xbuf + q_bytes);
  float* sxs = sx + n * groups;
  parallel_for(pool, n, [&](int64_t i0, int64_t i1) { quantize_x(x, k, i0, i1, xq8, sx, sxs); }, 4);
  const QuantizedX xq{xq8, sx, sxs, k};
  if (path == GgufPath::kRows || (path == GgufPath::kAuto && n <= kGgufRowsMaxN))
    return matmul_nt_gguf_rows_vnni(pool, xq, n, w, bias, y);

  const int64_t row_bytes = ggml_row_bytes(w.ggml_type, k);
  const int64_t n_panels = (m + kRows - 1) / kRows;
  parallel_for(pool, n_panels, [&](int64_t p_begin, int64_t p_end) {
    // codes, scale, offset, rows (each 64-byte aligned by its size)
    constexpr int64_t kTable = kChunk / kG * kRows;
    char* buf = ws.thread_buffer<char>("matmul_gguf.panel", 2 * kChunk * kRows + 2 * kTable * 4);
    PanelScratch s;
    s.codes = reinterpret_cast<uint8_t*>(buf);
    s.scale = reinterpret_cast<float*>(buf + kChunk * kRows);
    s.offset = s.scale + kTable;
    s.rows = reinterpret_cast<uint8_t*>(s.offset + kTable);
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t j0 = p * kRows;
      for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
        const int64_t cw = std::min(kChunk, k - c0);
        decode_panel(w, row_bytes, j0, c0, cw, s);
        const int64_t tiles = (n + kMaxTile - 1) / kMaxTile, base = n / tiles, extra = n % tiles;
        int64_t i = 0;
        for (int64_t t = 0; t < tiles; ++t) {
          const int rows = static_cast<int>(base + (t < extra ? 1 : 0));
          tile_rows(rows, xq, i, s, c0, cw, c0 == 0, c0 + cw == k, bias, y, m, j0);
          i += rows;
        }
      }
    }
  });
}

}  // namespace dc::cpu
