// matmul_nt over q8 / q4 weights. Three kernels (see ops/cpu/quant.h): the reference (dequantize a row,
// dot in double), a portable one (dequantize 32 rows to f32, 4×4 FMA tiles) and the AVX-512 VNNI one.
//
// The VNNI kernel writes every weight as w = s·u + mn with an unsigned byte code u (q8: u = q + 128,
// mn = −128·s; q4: u = the nibble, s and mn the group's) and rounds x per row and x block X of 128
// columns to int8: x ≈ sx_X · xq. Then  Σ_X w·x = sx_X·Σ_g∈X s_g·Σ u·xq + Σ_g mn_g·(sx_X·Σ xq):  the
// u8×s8 sums are exact int32 (vpdpbusd), turned to f32 once per group (q4) or x block (q8: the int32 sum
// starts at −128·Σ xq, so it is Σ q·xq, and the row scale s is applied once at the end). The kernel
// reads 32-row panels in the kPanels layout (ops/weight.h): one 64-byte vector holds 4 consecutive
// codes of 16 rows (lane = weight row; kQ4: two nibbles per byte, split in registers), so one broadcast
// of 4 bytes of x feeds 16 rows at once; a register tile of up to 8 rows of x passes over one chunk of
// a panel (4096 columns) at a time, and y accumulates once per x block. Weights packed at load
// (Model::pack_weights) are read in place as one sequential stream, prefetched one chunk ahead;
// row-major ones are repacked per thread, one chunk at a time.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/matmul_gguf.h"
#include "ops/cpu/quant.h"
#include "ops/cpu/simd_avx512.h"

// GCC 12's AVX-512 headers build some intrinsics on _mm*_undefined_*(), which -Wuninitialized flags
// once they are inlined into target("avx512...") functions: false positives.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

// ---- reference ------------------------------------------------------------------------------------

void matmul_reference(ThreadPool* pool, const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
  const int64_t m = w.rows, k = w.cols;
  parallel_for(pool, m, [&](int64_t j0, int64_t j1) {
    std::vector<float> row(k);
    for (int64_t j = j0; j < j1; ++j) {
      w.row_to_f32(j, row.data());
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * k;
        double acc = bias != nullptr ? bias[j] : 0.0;
        for (int64_t t = 0; t < k; ++t) acc += static_cast<double>(xi[t]) * row[t];
        y[i * m + j] = static_cast<float>(acc);
      }
    }
  }, 8);
}

// ---- portable: dequantize 32 rows, f32 tiles ------------------------------------------------------

constexpr int64_t kDequantRows = 32;

// out[a][b] = x row a · w row b for 4 x rows (stride ldx) and 4 w rows (stride k).
inline void tile4x4(const float* x, int64_t ldx, const float* w, int64_t k, float* out /*[4][4]*/) {
  const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
  const float *w0 = w, *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
  float a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
  float a20 = 0, a21 = 0, a22 = 0, a23 = 0, a30 = 0, a31 = 0, a32 = 0, a33 = 0;
#pragma omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33)
  for (int64_t t = 0; t < k; ++t) {
    const float b0 = w0[t], b1 = w1[t], b2 = w2[t], b3 = w3[t];
    a00 += x0[t] * b0; a01 += x0[t] * b1; a02 += x0[t] * b2; a03 += x0[t] * b3;
    a10 += x1[t] * b0; a11 += x1[t] * b1; a12 += x1[t] * b2; a13 += x1[t] * b3;
    a20 += x2[t] * b0; a21 += x2[t] * b1; a22 += x2[t] * b2; a23 += x2[t] * b3;
    a30 += x3[t] * b0; a31 += x3[t] * b1; a32 += x3[t] * b2; a33 += x3[t] * b3;
  }
  const float r[16] = {a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33};
  std::copy(r, r + 16, out);
}

inline float dot(const float* a, const float* b, int64_t k) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t t = 0; t < k; ++t) acc += a[t] * b[t];
  return acc;
}

void matmul_dequant_f32(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                        const float* bias, float* y) {
  const int64_t m = w.rows, k = w.cols;
  const int64_t n_blocks = (m + kDequantRows - 1) / kDequantRows;
  parallel_for(pool, n_blocks, [&](int64_t b_begin, int64_t b_end) {
    float* wf = ws.thread_buffer<float>("matmul_quant.rows", kDequantRows * k);
    for (int64_t blk = b_begin; blk < b_end; ++blk) {
      const int64_t j0 = blk * kDequantRows, nj = std::min(kDequantRows, m - j0);
      for (int64_t r = 0; r < nj; ++r) w.row_to_f32(j0 + r, wf + r * k);
      const int64_t nj4 = nj & ~int64_t{3}, n4 = n & ~int64_t{3};
      float tile[16];
      for (int64_t i = 0; i < n4; i += 4) {
        for (int64_t j = 0; j < nj4; j += 4) {
          tile4x4(x + i * k, k, wf + j * k, k, tile);
          for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 4; ++b) y[(i + a) * m + j0 + j + b] = tile[a * 4 + b];
        }
        for (int64_t j = nj4; j < nj; ++j)
          for (int a = 0; a < 4; ++a) y[(i + a) * m + j0 + j] = dot(x + (i + a) * k, wf + j * k, k);
      }
      for (int64_t i = n4; i < n; ++i)
        for (int64_t j = 0; j < nj; ++j) y[i * m + j0 + j] = dot(x + i * k, wf + j * k, k);
      if (bias != nullptr)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < nj; ++j) y[i * m + j0 + j] += bias[j0 + j];
    }
  });
}

// ---- AVX-512 VNNI ---------------------------------------------------------------------------------

#define DC_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

constexpr int64_t kBlock = kQuantBlock;  // columns per kPanels block (8 steps of 4 columns)
// Columns per x scale and per int32 partial sum (kQ4: per group, which divides it). 128 rather than 32:
// the int32 → f32 conversion per x block was 30 % of the kernel's time at 32 (q8, in L1).
constexpr int64_t kXBlock = kInt8XBlock;
constexpr int64_t kPanelRows = kQuantPanelRows;  // weight rows per task: two vectors of 16 lanes
constexpr int64_t kQ8BlockBytes = 8 * 2 * 64;     // kPanels: 8 steps of 4 columns × 2 vectors × 64 bytes
constexpr int64_t kQ4BlockBytes = 4 * 2 * 64;     // kPanels: two nibbles per byte
// Blocks repacked (row-major weights) or multiplied (kPanels) at a time: 128 KiB of q8 codes (in L2)
// and, per register tile, 32 KiB of x (in L1). Measured at the 7B shapes against 8..1024 blocks: below
// 64 each chunk costs a pass of y and more restarts; above 128 x falls out of L1.
constexpr int64_t kChunkBlocks = 128;
constexpr int64_t kPrefetchChunks = 2;  // how far ahead the rows of W are prefetched (1-3 measure alike)

// x rounded to int8 per row and x block of kXBlock columns (see the file comment).
struct QuantizedX {
  int8_t* q = nullptr;       // [n, nb * 32]; kQ4: each 32-column block's columns as 0,2,..,30,1,3,..,31
  float* scale = nullptr;    // [n, nxb]  sx of each x block
  float* sum = nullptr;      // [n, n_units]  Σ xq over a group (kQ4 groups of 32 / 64) or an x block  (q4)
  int32_t* isum = nullptr;   // [n, nxb]  −128 · Σ xq over the x block                (kQ8)
  int64_t nb = 0, nxb = 0, n_units = 0;
};

using simd::mask16;

// Rows [i0, i1) of x. kQ4 (group > 0): group divides kXBlock or is a multiple of it.
DC_TARGET_VNNI void quantize_x_rows(const float* x, int64_t k, int64_t i0, int64_t i1, int64_t group,
                                    const QuantizedX& xq) {
  const bool q4 = group > 0;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  constexpr int kSub = kXBlock / kBlock;
  for (int64_t i = i0; i < i1; ++i) {
    const float* xi = x + i * k;
    int8_t* qi = xq.q + i * xq.nb * kBlock;
    for (int64_t X = 0; X < xq.nxb; ++X) {
      __m512 a[kSub][2];
      __m512 amax = _mm512_setzero_ps();
      for (int u = 0; u < kSub; ++u) {
        const int64_t c0 = X * kXBlock + u * kBlock, c = k - c0;
        a[u][0] = _mm512_maskz_loadu_ps(mask16(c), xi + c0);
        a[u][1] = _mm512_maskz_loadu_ps(mask16(c - 16), xi + c0 + 16);
        if (q4) {
          const __m512 e = _mm512_permutex2var_ps(a[u][0], even, a[u][1]);
          const __m512 o = _mm512_permutex2var_ps(a[u][0], odd, a[u][1]);
          a[u][0] = e;
          a[u][1] = o;
        }
        amax = _mm512_max_ps(amax, _mm512_max_ps(_mm512_abs_ps(a[u][0]), _mm512_abs_ps(a[u][1])));
      }
      const float mx = _mm512_reduce_max_ps(amax), sx = mx / 127.0f;
      const __m512 inv = _mm512_set1_ps(mx > 0 ? 127.0f / mx : 0.0f);
      int32_t totals[kSub];
      for (int u = 0; u < kSub; ++u) {
        const int64_t b = X * kSub + u;
        if (b >= xq.nb) {
          totals[u] = 0;
          continue;
        }
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a[u][0], inv));  // round to nearest even
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a[u][1], inv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qi + b * kBlock), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qi + b * kBlock + 16), _mm512_cvtsepi32_epi8(q1));
        totals[u] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      }
      xq.scale[i * xq.nxb + X] = sx;
      if (q4) {
        const int64_t per_unit = std::min(group, kXBlock) / kBlock;
        for (int u = 0; u < kSub; u += per_unit) {
          const int64_t g = (X * kXBlock + u * kBlock) / (per_unit * kBlock);
          if (g >= xq.n_units) break;
          int32_t t = 0;
          for (int v = u; v < u + per_unit; ++v) t += totals[v];
          xq.sum[i * xq.n_units + g] = static_cast<float>(t);
        }
      } else {
        int32_t t = 0;
        for (int u = 0; u < kSub; ++u) t += totals[u];
        xq.isum[i * xq.nxb + X] = -128 * t;
      }
    }
  }
}

// 16 bytes at p, the bytes at and after p + count read as zero.
DC_TARGET_VNNI inline __m128i load16(const uint8_t* p, int64_t count) {
  if (count >= 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm_maskz_loadu_epi8(mask16(count), p);
}

DC_TARGET_VNNI inline __m512i load4x16(const uint8_t* const* rows, int64_t offset, int64_t count) {
  __m512i v = _mm512_castsi128_si512(load16(rows[0] + offset, count));
  v = _mm512_inserti32x4(v, load16(rows[1] + offset, count), 1);
  v = _mm512_inserti32x4(v, load16(rows[2] + offset, count), 2);
  return _mm512_inserti32x4(v, load16(rows[3] + offset, count), 3);
}

// In: r[a] holds rows 4a..4a+3 (one per 128-bit lane), 4 steps of 4 bytes each. Out: r[t] holds step t
// of rows 0..15 (lane l = row l).
DC_TARGET_VNNI inline void transpose_rows_to_steps(__m512i r[4]) {
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (int a = 0; a < 4; ++a) r[a] = _mm512_permutexvar_epi32(tr, r[a]);  // 128-bit lane t: step t
  const __m512i x0 = _mm512_shuffle_i32x4(r[0], r[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i x1 = _mm512_shuffle_i32x4(r[0], r[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i y0 = _mm512_shuffle_i32x4(r[2], r[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i y1 = _mm512_shuffle_i32x4(r[2], r[3], _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(2, 0, 2, 0));
  r[1] = _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(3, 1, 3, 1));
  r[2] = _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(2, 0, 2, 0));
  r[3] = _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(3, 1, 3, 1));
}

// The 16 rows of vector v of the panel at j0 (rows past the end repeat the last row).
struct PanelRows {
  const uint8_t* ptr[16];
  int64_t index[16];
};

PanelRows panel_rows(const WeightView& w, int64_t j0, int v) {
  const int64_t row_bytes = w.quant == WeightQuant::kQ4 ? w.cols / 2 : w.cols;
  PanelRows p;
  for (int l = 0; l < 16; ++l) {
    p.index[l] = std::min(j0 + 16 * v + l, w.rows - 1);
    p.ptr[l] = static_cast<const uint8_t*>(w.data) + p.index[l] * row_bytes;
  }
  return p;
}

// Prefetches (into L2) what pack_codes and pack_group_table will read for blocks [b0, b1) of the panel,
// so that the next chunk's rows stream in while this one is multiplied (the rows are k/2 or k bytes
// apart: left alone, their loads stall one cache miss at a time).
DC_TARGET_VNNI void prefetch_chunk(const WeightView& w, const PanelRows rows[2], int64_t b0, int64_t b1) {
  const bool q4 = w.quant == WeightQuant::kQ4;
  const int64_t bytes_per_block = q4 ? 16 : kBlock, row_bytes = q4 ? w.cols / 2 : w.cols;
  const int64_t begin = b0 * bytes_per_block, end = std::min(b1 * bytes_per_block, row_bytes);
  const int64_t n_groups = q4 ? w.cols / w.group_size : 0, bpg = q4 ? w.group_size / kBlock : 1;
  for (int v = 0; v < 2; ++v)
    for (int l = 0; l < 16; ++l) {
      for (int64_t at = begin & ~int64_t{63}; at < end; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rows[v].ptr[l] + at), _MM_HINT_T1);
      if (q4) {
        const int64_t g = rows[v].index[l] * n_groups + b0 / bpg;
        _mm_prefetch(reinterpret_cast<const char*>(static_cast<const uint16_t*>(w.scales) + g), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(static_cast<const uint16_t*>(w.mins) + g), _MM_HINT_T1);
      }
    }
}

// Writes the kPanels form (ops/weight.h) of blocks [b0, b1) of the panel `rows` to codes[b - b0]: kQ8
// [step 0..7][vector 0..1][64 bytes], lane l of a vector holding 4 codes q + 128 of row 16·vector + l;
// kQ4 [t 0..3][vector][64], lane l holding row-major bytes 4t..4t+3 of the block (two nibbles each).
DC_TARGET_VNNI void pack_codes(const WeightView& w, const PanelRows rows[2], int64_t b0, int64_t b1, uint8_t* codes) {
  const int64_t k = w.cols;
  const bool q4 = w.quant == WeightQuant::kQ4;
  const int64_t block_bytes = q4 ? kQ4BlockBytes : kQ8BlockBytes;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int v = 0; v < 2; ++v) {
    for (int64_t b = b0; b < b1; ++b) {
      uint8_t* out = codes + (b - b0) * block_bytes + v * 64;
      __m512i lo[4], hi[4];
      for (int a = 0; a < 4; ++a) {
        if (q4) {
          lo[a] = load4x16(rows[v].ptr + 4 * a, b * 16, 16);
        } else {
          lo[a] = _mm512_xor_si512(load4x16(rows[v].ptr + 4 * a, b * kBlock, k - b * kBlock), flip);
          hi[a] = _mm512_xor_si512(load4x16(rows[v].ptr + 4 * a, b * kBlock + 16, k - b * kBlock - 16), flip);
        }
      }
      transpose_rows_to_steps(lo);
      for (int t = 0; t < 4; ++t) _mm512_store_si512(out + t * 128, lo[t]);
      if (q4) continue;
      transpose_rows_to_steps(hi);
      for (int t = 0; t < 4; ++t) _mm512_store_si512(out + (t + 4) * 128, hi[t]);
    }
  }
}

// kQ4: groups [g0, g1) of a row-major f16 scale or min table for the panel `rows`: out[g - g0][32].
void pack_group_table(const uint16_t* table, int64_t n_groups, const PanelRows rows[2], int64_t g0, int64_t g1,
                      uint16_t* out) {
  for (int64_t g = g0; g < g1; ++g)
    for (int v = 0; v < 2; ++v)
      for (int l = 0; l < 16; ++l) out[(g - g0) * 32 + 16 * v + l] = table[rows[v].index[l] * n_groups + g];
}

// One chunk of a panel: blocks [b0, b0 + n_blocks) of the 32 weight rows from j0, in the kPanels form
// (codes from block b0 on). b0 and, unless the range ends at nb, n_blocks are multiples of the
// kXBlock / 32 blocks of an x block.
struct PanelChunk {
  const uint8_t* codes;
  int64_t b0, n_blocks;
  const float* row_sc;        // kQ8: f32 [32] row scales
  const uint16_t *sc, *mn;    // kQ4: f16 [g - g0][32] scales and mins per group g = b / bpg
  int64_t bpg, g0;
  bool first, last;           // first: y starts from zero (else it is added to); last: finish and add the bias
  const float* bias;
  float* y;                   // [n, m]
  int64_t m, j0;
  __mmask16 keep[2];          // the columns of y that exist
  // kPanels: the first ahead_lines of the n_blocks blocks of codes from `ahead` (one chunk further on in
  // this thread's stream) are prefetched, spread evenly over every tile's pass (0: none).
  const uint8_t* ahead;
  int64_t ahead_lines;
};

// kQ4: q4 with groups of 32 or 64 columns (several per x block); kQ4Wide: groups of a multiple of 128.
enum class Kind { kQ8, kQ4, kQ4Wide };

// y rows [i0, i0 + R), columns [j0, j0 + 32) over one chunk, as register tile `tile` of `tiles` (its
// share of the prefetch). The int32 sums (and, kQ4, the per-group f32 sum `part`) live in registers; y
// itself accumulates once per x block, so that the register tile can hold more rows of x.
template <int R, Kind K>
DC_TARGET_VNNI void panel_tile(const QuantizedX& xq, int64_t i0, int64_t tile, int64_t tiles, const PanelChunk& c) {
  constexpr bool kQ8 = K == Kind::kQ8;
  constexpr int64_t kSub = kXBlock / kBlock;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int64_t row_stride = xq.nb * kBlock;
  float* yt = c.y + i0 * c.m + c.j0;  // row r, vector v at yt + r·m + 16·v
  if (c.first)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 2; ++v) _mm512_mask_storeu_ps(yt + r * c.m + 16 * v, c.keep[v], _mm512_setzero_ps());
  auto add_to_y = [&](int r, int v, __m512 a, __m512 sx) DC_TARGET_VNNI {  // (a lambda has no target of its own)
    float* p = yt + r * c.m + 16 * v;
    _mm512_mask_storeu_ps(p, c.keep[v], _mm512_fmadd_ps(a, sx, _mm512_maskz_loadu_ps(c.keep[v], p)));
  };
  __m512i acc[R][2];
  // The 32 columns of block b into acc.
  auto block = [&](int64_t b) DC_TARGET_VNNI {
    const int8_t* xb = xq.q + i0 * row_stride + b * kBlock;
    auto step = [&](__m512i w0, __m512i w1, int s) DC_TARGET_VNNI {  // step s: 4 columns (x positions 4s..4s+3)
      for (int r = 0; r < R; ++r) {
        int32_t x4;
        std::memcpy(&x4, xb + r * row_stride + 4 * s, 4);
        const __m512i xv = _mm512_set1_epi32(x4);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, xv);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, xv);
      }
    };
    if (c.ahead_lines > 0) {  // visit v of tiles · n_blocks prefetches lines [v·L/V, (v+1)·L/V) of L
      constexpr int64_t kLines = (kQ8 ? kQ8BlockBytes : kQ4BlockBytes) / 64;
      const int64_t lines = c.n_blocks * kLines, visits = tiles * c.n_blocks, v = tile * c.n_blocks + b - c.b0;
      const int64_t l1 = std::min((v + 1) * lines / visits, c.ahead_lines);
      for (int64_t l = v * lines / visits; l < l1; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(c.ahead + l * 64), _MM_HINT_T1);
    }
    if constexpr (kQ8) {
      const uint8_t* cb = c.codes + (b - c.b0) * kQ8BlockBytes;
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) step(_mm512_load_si512(cb + s * 128), _mm512_load_si512(cb + s * 128 + 64), s);
    } else {
      const uint8_t* cb = c.codes + (b - c.b0) * kQ4BlockBytes;
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {  // low nibbles: even columns (steps 0..3); high: odd (steps 4..7)
        const __m512i p0 = _mm512_load_si512(cb + t * 128), p1 = _mm512_load_si512(cb + t * 128 + 64);
        step(_mm512_and_si512(p0, low4), _mm512_and_si512(p1, low4), t);
        step(_mm512_and_si512(_mm512_srli_epi16(p0, 4), low4), _mm512_and_si512(_mm512_srli_epi16(p1, 4), low4), t + 4);
      }
    }
  };
  const int64_t end = c.b0 + c.n_blocks;
  for (int64_t x0 = c.b0; x0 < end; x0 += kSub) {  // one x block: blocks [x0, x1)
    const int64_t x1 = std::min(x0 + kSub, end), X = x0 / kSub;
    if constexpr (kQ8) {
      // The codes are q + 128: start from −128·Σ xq so that the sum is exactly Σ q·xq.
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_set1_epi32(xq.isum[(i0 + r) * xq.nxb + X]);
      for (int64_t b = x0; b < x1; ++b) block(b);
      for (int r = 0; r < R; ++r) {
        const __m512 sx = _mm512_set1_ps(xq.scale[(i0 + r) * xq.nxb + X]);
        for (int v = 0; v < 2; ++v) add_to_y(r, v, _mm512_cvtepi32_ps(acc[r][v]), sx);
      }
    } else {
      // y += sx_X · Σ_g∈X (s_g·Σ u·xq + mn_g·Σ xq), the sum over the groups in `part` (kQ4Wide: the x
      // block lies in one group, and Σ xq is the x block's).
      __m512 part[R][2];
      const int64_t span = K == Kind::kQ4Wide ? kSub : c.bpg;
      for (int64_t gb = x0; gb < x1; gb += span) {
        for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        for (int64_t b = gb; b < std::min(gb + span, x1); ++b) block(b);
        const int64_t g = gb / c.bpg, t = (g - c.g0) * 32, unit = K == Kind::kQ4Wide ? X : g;
        __m512 sg[2], mg[2];
        for (int v = 0; v < 2; ++v) {
          sg[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.sc + t + 16 * v)));
          mg[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.mn + t + 16 * v)));
        }
        for (int r = 0; r < R; ++r) {
          const __m512 xs = _mm512_set1_ps(xq.sum[(i0 + r) * xq.n_units + unit]);
          const __m512 sx = _mm512_set1_ps(xq.scale[(i0 + r) * xq.nxb + X]);
          for (int v = 0; v < 2; ++v) {
            const __m512 a = _mm512_fmadd_ps(mg[v], xs, _mm512_cvtepi32_ps(acc[r][v]) * sg[v]);
            if constexpr (K == Kind::kQ4Wide) {
              add_to_y(r, v, a, sx);
            } else {
              part[r][v] = gb == x0 ? a : _mm512_add_ps(part[r][v], a);
            }
          }
        }
      }
      if constexpr (K == Kind::kQ4) {
        for (int r = 0; r < R; ++r) {
          const __m512 sx = _mm512_set1_ps(xq.scale[(i0 + r) * xq.nxb + X]);
          for (int v = 0; v < 2; ++v) add_to_y(r, v, part[r][v], sx);
        }
      }
    }
  }
  if (!c.last) return;
  for (int v = 0; v < 2; ++v) {
    const __m512 bv = c.bias != nullptr ? _mm512_maskz_loadu_ps(c.keep[v], c.bias + c.j0 + 16 * v) : _mm512_setzero_ps();
    const __m512 rs = kQ8 ? _mm512_load_ps(c.row_sc + 16 * v) : _mm512_set1_ps(1.0f);
    for (int r = 0; r < R; ++r) {
      float* p = yt + r * c.m + 16 * v;
      _mm512_mask_storeu_ps(p, c.keep[v], _mm512_fmadd_ps(_mm512_maskz_loadu_ps(c.keep[v], p), rs, bv));
    }
  }
}

// All n rows of x against one chunk, in ⌈n / max⌉ register tiles of near-equal height (33 rows: 7, 7,
// 7, 6, 6 rather than 8, 8, 8, 8, 1). max: 8 rows (16 int32 accumulators; best of 6, 8, 10, 12 for q8),
// kQ4 6 (12 int32 and 12 f32 `part` accumulators; best of 4, 5, 6).
template <Kind K>
constexpr int kMaxTileRows = K == Kind::kQ4 ? 6 : 8;

template <Kind K, int R = kMaxTileRows<K>>
DC_TARGET_VNNI void tile_rows(const QuantizedX& xq, int64_t i0, int rows, int64_t tile, int64_t tiles,
                              const PanelChunk& c) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows<K, R - 1>(xq, i0, rows, tile, tiles, c);
  }
  panel_tile<R, K>(xq, i0, tile, tiles, c);
}

template <Kind K>
DC_TARGET_VNNI void panel_rows_all_x(const QuantizedX& xq, int64_t n, const PanelChunk& c) {
  const int64_t tiles = (n + kMaxTileRows<K> - 1) / kMaxTileRows<K>, base = n / tiles, extra = n % tiles;
  int64_t i = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int rows = static_cast<int>(base + (t < extra ? 1 : 0));
    tile_rows<K>(xq, i, rows, t, tiles, c);
    i += rows;
  }
}

DC_TARGET_VNNI void matmul_vnni(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                                const float* bias, float* y) {
  const int64_t m = w.rows, k = w.cols;
  const int64_t nb = (k + kBlock - 1) / kBlock;
  const bool q4 = w.quant == WeightQuant::kQ4, packed = w.layout == WeightLayout::kPanels;
  const int64_t block_bytes = q4 ? kQ4BlockBytes : kQ8BlockBytes;
  const int64_t nxb = (k + kXBlock - 1) / kXBlock, n_groups = q4 ? k / w.group_size : 0;
  const int64_t n_units = q4 ? k / std::min(w.group_size, kXBlock) : 0;
  const size_t q_bytes = static_cast<size_t>(n * nb * kBlock + 63) & ~size_t{63};
  char* xbuf = ws.thread_buffer<char>("matmul_quant.x", q_bytes + n * (nxb + std::max(nxb, n_units)) * sizeof(float));
  QuantizedX xq;
  xq.q = reinterpret_cast<int8_t*>(xbuf);
  xq.scale = reinterpret_cast<float*>(xbuf + q_bytes);
  xq.sum = xq.scale + n * nxb;
  xq.isum = reinterpret_cast<int32_t*>(xq.sum);
  xq.nb = nb;
  xq.nxb = nxb;
  xq.n_units = n_units;
  parallel_for(pool, n, [&](int64_t i0, int64_t i1) { quantize_x_rows(x, k, i0, i1, q4 ? w.group_size : 0, xq); }, 4);

  const int64_t n_panels = (m + kPanelRows - 1) / kPanelRows;
  const int64_t bpg = q4 ? w.group_size / kBlock : 1;
  parallel_for(pool, n_panels, [&](int64_t p_begin, int64_t p_end) {
    auto* scratch = ws.thread_buffer<uint8_t>("matmul_quant.panel", kChunkBlocks * (kQ8BlockBytes + 2 * 32 * sizeof(uint16_t)) +
                                               32 * sizeof(float));
    auto* row_sc = reinterpret_cast<float*>(scratch);  // kQ8: [32] row scales of the panel
    uint8_t* chunk_codes = scratch + 32 * sizeof(float);
    auto* chunk_sc = reinterpret_cast<uint16_t*>(chunk_codes + kChunkBlocks * kQ8BlockBytes);
    uint16_t* chunk_mn = chunk_sc + kChunkBlocks * 32;
    // Row-major weights: chunk s of this task is chunk s % n_chunks of panel p_begin + s / n_chunks; the
    // chunk kPrefetchChunks ahead is prefetched before each chunk is packed. kPanels weights are one
    // sequential stream, prefetched (into L2) one chunk ahead, spread over all tiles' passes (PanelChunk):
    // left to the hardware prefetchers, the first tile's pass stalled on memory (q8 at the 7B shapes,
    // 33 rows: 21 ms per 272 MB matrix; prefetched by the first tile only 16.5 ms; spread 14.9 ms).
    const int64_t n_chunks = (nb + kChunkBlocks - 1) / kChunkBlocks, n_steps = (p_end - p_begin) * n_chunks;
    auto prefetch_step = [&](int64_t step) {
      if (step >= n_steps) return;
      const int64_t pj = (p_begin + step / n_chunks) * kPanelRows, c = step % n_chunks * kChunkBlocks;
      const PanelRows r[2] = {panel_rows(w, pj, 0), panel_rows(w, pj, 1)};
      prefetch_chunk(w, r, c, std::min(nb, c + kChunkBlocks));
    };
    if (!packed)
      for (int64_t step = 0; step < kPrefetchChunks; ++step) prefetch_step(step);
    int64_t step = 0;
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t j0 = p * kPanelRows;
      const __mmask16 keep[2] = {mask16(m - j0), mask16(m - j0 - 16)};
      const PanelRows rows[2] = {panel_rows(w, j0, 0), panel_rows(w, j0, 1)};
      if (!q4) {
        const auto* s32 = static_cast<const float*>(w.scales);
        for (int v = 0; v < 2; ++v)
          for (int l = 0; l < 16; ++l) row_sc[v * 16 + l] = s32[rows[v].index[l]];
      }
      const uint8_t* panel_codes = static_cast<const uint8_t*>(w.data) + p * nb * block_bytes;
      for (int64_t c0 = 0; c0 < nb; c0 += kChunkBlocks, ++step) {
        const int64_t c1 = std::min(nb, c0 + kChunkBlocks);
        const int64_t g0 = c0 / bpg, g1 = (c1 + bpg - 1) / bpg;
        const uint8_t* codes = chunk_codes;
        const uint16_t *sc = chunk_sc, *mn = chunk_mn;
        if (packed) {
          codes = panel_codes + c0 * block_bytes;
          if (q4) {
            sc = static_cast<const uint16_t*>(w.scales) + (p * n_groups + g0) * 32;
            mn = static_cast<const uint16_t*>(w.mins) + (p * n_groups + g0) * 32;
          }
        } else {
          prefetch_step(step + kPrefetchChunks);
          pack_codes(w, rows, c0, c1, chunk_codes);
          if (q4) {
            pack_group_table(static_cast<const uint16_t*>(w.scales), n_groups, rows, g0, g1, chunk_sc);
            pack_group_table(static_cast<const uint16_t*>(w.mins), n_groups, rows, g0, g1, chunk_mn);
          }
        }
        // The stream one chunk on, up to the end of this thread's panels (byte offsets into w.data).
        const int64_t ahead = (p * nb + c0 + kChunkBlocks) * block_bytes, stream_end = p_end * nb * block_bytes;
        const int64_t ahead_lines = packed ? std::clamp<int64_t>(stream_end - ahead, 0, (c1 - c0) * block_bytes) / 64 : 0;
        const uint8_t* ahead_ptr = ahead_lines > 0 ? static_cast<const uint8_t*>(w.data) + ahead : nullptr;
        const PanelChunk chunk{codes, c0, c1 - c0, row_sc, sc, mn, bpg, g0, c0 == 0, c1 == nb, bias, y, m, j0,
                               {keep[0], keep[1]}, ahead_ptr, ahead_lines};
        if (!q4) {
          panel_rows_all_x<Kind::kQ8>(xq, n, chunk);
        } else if (w.group_size % kXBlock == 0) {
          panel_rows_all_x<Kind::kQ4Wide>(xq, n, chunk);
        } else {
          panel_rows_all_x<Kind::kQ4>(xq, n, chunk);
        }
      }
    }
  });
}

}  // namespace

bool cpu_has_avx512_vnni() {
  static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("avx512vnni"));
  return has && cpu_has_avx512();  // cpu_has_avx512() honours force_portable_kernels_for_testing
}

bool int8_kernel_supports(const WeightView& w) {
  if (!cpu_has_avx512_vnni()) return false;
  if (w.quant == WeightQuant::kGguf) return w.layout == WeightLayout::kRowMajor;
  const int64_t g = w.group_size;
  return w.quant == WeightQuant::kQ8 || (g % kBlock == 0 && (kXBlock % g == 0 || g % kXBlock == 0));
}

void matmul_nt_quant(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w,
                     const float* bias, float* y, QuantKernel kernel) {
  if (n <= 0) return;
  const bool vnni_ok = int8_kernel_supports(w);
  if (kernel == QuantKernel::kAuto) kernel = vnni_ok ? QuantKernel::kInt8Vnni : QuantKernel::kDequantF32;
  switch (kernel) {
    case QuantKernel::kReference:
      matmul_reference(pool, x, n, w, bias, y);
      return;
    case QuantKernel::kInt8Vnni:
      if (vnni_ok && w.quant == WeightQuant::kGguf) {
        matmul_nt_gguf_vnni(pool, ws, x, n, w, bias, y);
        return;
      }
      if (vnni_ok) {
        matmul_vnni(pool, ws, x, n, w, bias, y);
        return;
      }
      [[fallthrough]];
    case QuantKernel::kAuto:
    case QuantKernel::kDequantF32:
      matmul_dequant_f32(pool, ws, x, n, w, bias, y);
      return;
  }
}

void pack_quant_panels(ThreadPool* pool, const WeightView& w, int64_t panel_begin, int64_t panel_end, uint8_t* codes,
                       uint16_t* scales, uint16_t* mins) {
  const bool q4 = w.quant == WeightQuant::kQ4;
  const int64_t nb = (w.cols + kBlock - 1) / kBlock, block_bytes = q4 ? kQ4BlockBytes : kQ8BlockBytes;
  const int64_t n_groups = q4 ? w.cols / w.group_size : 0;
  parallel_for(pool, panel_end - panel_begin, [&](int64_t b, int64_t e) {
    for (int64_t p = panel_begin + b; p < panel_begin + e; ++p) {
      const PanelRows rows[2] = {panel_rows(w, p * kPanelRows, 0), panel_rows(w, p * kPanelRows, 1)};
      pack_codes(w, rows, 0, nb, codes + p * nb * block_bytes);
      if (!q4) continue;
      pack_group_table(static_cast<const uint16_t*>(w.scales), n_groups, rows, 0, n_groups, scales + p * n_groups * 32);
      pack_group_table(static_cast<const uint16_t*>(w.mins), n_groups, rows, 0, n_groups, mins + p * n_groups * 32);
    }
  });
}

}  // namespace dc::cpu
