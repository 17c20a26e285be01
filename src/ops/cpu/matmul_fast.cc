// Fast CPU matmul_nt, y[n, m] = x[n, k] · Wᵀ (+ bias), AVX-512 with f32 accumulation.
// Larger n: W is packed one panel (64 rows of W × kc of k) at a time into a per-thread buffer laid out
// for broadcast micro-kernels (6 rows of x × 64 columns of y = 24 accumulator registers); the panel is
// reused by every row of x, and packing prefetches the next block of W. Small n (see kSmallN): dot
// products straight over the rows of W (no packing; W streamed once, prefetched). bf16 precision: x
// rounded to bf16 once per call, vdpbf16ps over bf16 pairs of k. f32 precision: W widened to f32,
// vfmadd231ps. Weights already in the kPanels layout (ops/weight.h, packed once at load) skip the
// packing at bf16 precision, for every n: the micro-kernels read them in place while the next block is
// prefetched; at f32 precision their pairs are widened per block. f16 weights at bf16 precision: each
// packed block is split exactly into bf16 hi + lo panels (pack_f16.h), both through the bf16
// micro-kernels; the f32 dot-product kernels take them with x rounded to bf16 once. Threads take
// (rows × panels) tasks from a counter; each output is summed in the same order whatever the thread count.
#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "ops/cpu/gemm_bf16_micro.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/pack_f16.h"
#include "ops/cpu/simd_avx512.h"

// GCC 12's AVX-512 headers build some intrinsics on _mm*_undefined_*(), which -Wuninitialized flags
// once they are inlined into target("avx512...") functions: false positives.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using simd::mask16;
using simd::mask32;
using gemm::Init;
using gemm::kNv;
using gemm::kPanel;
using gemm::amx_configure;
using gemm::amx_release;
using gemm::init_acc;
using gemm::micro_amx;
using gemm::micro_bf16;
using gemm::store_acc;

constexpr int kMr = 6;              // rows of x per micro-tile
// k per packed panel: 512 pairs (bf16) or 512 values (f32) × 64 columns × 4 B = 128 KiB, streamed from
// L2. Measured on Zen 5 (bf16 kc 256 ... 4096): 1024 is 2-5% faster than 256 (fewer C-tile reloads).
constexpr int64_t kKcBf16 = 1024;
constexpr int64_t kKcF32 = 512;
// f16 weights at bf16 precision: the lo panel's offset (words) in the panel buffer, after the hi one.
constexpr int64_t kLoPanel = kKcBf16 / 2 * kPanel;
// The dot-product kernels (no packing) take n <= kSmallN, or n <= kSmallNShortK when k <= kShortK (16
// rows of W then stay in L1 while every group of 8 rows of x goes over them). Measured crossovers with
// the packed kernel on Zen 5: n ~ 9-12 for k >= 3584, n > 32 for k = 896.
constexpr int64_t kSmallN = 8;
constexpr int64_t kSmallNShortK = 32;
constexpr int64_t kShortK = 1024;
// The dot-product kernels prefetch each W row kPrefetch bytes ahead (to L1) and the same place in the
// next group of rows (to L2): measured 2x at n = 4 over the in-row prefetch alone, weights from memory.
constexpr int64_t kPrefetch = 512;
constexpr int64_t kConvRows = 32;     // rows of x per conversion block (bf16 precision)
constexpr int64_t kMaxRowBlock = 512;  // rows of x per task: the C tile (512 × 64 × 4 B) stays in L2
constexpr int64_t kMinRowBlock = 96;   // when rows are split for parallelism: packing stays < ~10%


int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- packing: panel[p][64] of W rows j0..j0+63 (rows >= nj are zero) ----

// bf16 pairs: dst[p * 64 + c] = (w[c, k0 + 2p], w[c, k0 + 2p + 1]) for p < ceil(kc / 2); an odd kc
// pads the last pair with 0. w: row c at w + c * ldw. `next` (or null): the first element of the block
// packed next (same row stride), prefetched into L2 meanwhile.
DC_TARGET_AVX512 void pack_pairs_bf16(const uint16_t* w, int64_t ldw, int64_t nj, int64_t k0, int64_t kc,
                                      const uint16_t* next, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2;
  for (int v = 0; v < kNv; ++v) {
    for (int64_t pp = 0; pp < kp; pp += 16) {  // 16 rows × 16 pairs per transpose
      const __mmask32 m = mask32(kc - 2 * pp);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t row = 16 * v + i;
        if (next) _mm_prefetch(reinterpret_cast<const char*>(next + row * ldw + 2 * pp), _MM_HINT_T1);
        r[i] = row < nj ? _mm512_maskz_loadu_epi16(m, w + row * ldw + k0 + 2 * pp) : _mm512_setzero_si512();
      }
      simd::transpose16x16_epi32(r);
      const int64_t np = std::min<int64_t>(16, kp - pp);
      for (int64_t t = 0; t < np; ++t) _mm512_store_si512(dst + (pp + t) * kPanel + 16 * v, r[t]);
    }
  }
}

// out[t] lane i = in[i] lane t for 8 vectors of 8 64-bit lanes: three butterfly stages (blocks of 1, 2, 4).
DC_TARGET_AVX512 DC_INLINE void transpose8x8_epi64(__m512i (&v)[8]) {
  const __m512i lo[3] = {_mm512_setr_epi64(0, 8, 2, 10, 4, 12, 6, 14), _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                         _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11)};
  const __m512i hi[3] = {_mm512_setr_epi64(1, 9, 3, 11, 5, 13, 7, 15), _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15),
                         _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15)};
#pragma GCC unroll 3
  for (int s = 0; s < 3; ++s) {
    const int b = 1 << s;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if (i & b) continue;
      const __m512i a = v[i], c = v[i + b];
      v[i] = _mm512_permutex2var_epi64(a, lo[s], c);
      v[i + b] = _mm512_permutex2var_epi64(a, hi[s], c);
    }
  }
}

// kPanelsTransposed, W's kPanels words wp (W [k rows, w_pairs pairs of columns], zero rows up to whole
// panels) read as Wᵀ [m, k]: dst[p * 64 + c] = (W[k0 + 2p, j0 + c], W[k0 + 2p + 1, j0 + c]) for p below
// ⌈kc/2⌉ rounded up to 8 and c < 64 (0 past W's columns); k0 a multiple of 64, j0 of 64. W's word for
// rows 2p and 2p + 1 at a pair q of columns are one 64-bit lane: a 16-bit swap inside it makes it the
// two words of columns 2q and 2q + 1 at row pair p, so per 16 rows (8 row pairs) × 8 pairs of columns
// an 8 × 8 transpose of 64-bit lanes gives 8 row pairs × 16 columns.
DC_TARGET_AVX512 void pack_pairs_transposed(const uint32_t* wp, int64_t w_pairs, int64_t j0, int64_t k0, int64_t kc,
                                            uint32_t* dst) {
  // (W[r, 2q], W[r, 2q + 1], W[r + 1, 2q], W[r + 1, 2q + 1]) → (W[r, 2q], W[r + 1, 2q], W[r, 2q + 1], W[r + 1, 2q + 1])
  const __m512i swap = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
  const int64_t q0 = j0 / 2;
  for (int64_t g = 0; g < (kc + 15) / 16; ++g) {  // rows k0 + 16g ... + 15 of W, row pairs 8g ... + 7
    const int64_t row = k0 + 16 * g;
    const uint32_t* panel = wp + (row / kPanel) * w_pairs * kPanel + row % kPanel;
    for (int h = 0; h < 4; ++h) {  // pairs q0 + 8h ... + 7: columns 16h ... + 15 of the block
      __m512i v[8];  // v[i] lane t: row pair 8g + t at columns 2(q0 + 8h + i), + 1
      for (int i = 0; i < 8; ++i) {
        const int64_t q = q0 + 8 * h + i;
        v[i] = q < w_pairs ? _mm512_shuffle_epi8(_mm512_load_si512(panel + q * kPanel), swap) : _mm512_setzero_si512();
      }
      transpose8x8_epi64(v);  // v[t] lane i: row pair 8g + t at columns 16h + 2i, + 1
      for (int t = 0; t < 8; ++t) _mm512_store_si512(dst + (8 * g + t) * kPanel + 16 * h, v[t]);
    }
  }
}

// 16 weights of one row as f32 (lanes beyond the mask are 0).
template <DType kW>
DC_TARGET_AVX512 DC_INLINE __m512 load_w16(const void* base, int64_t index, __mmask16 m) {
  if constexpr (kW == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + index);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(base) + index);
    if constexpr (kW == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// f32: dst[t * 64 + c] = w[c, k0 + t] for t < kc. w: row c at element c * ldw of the stored dtype;
// `next` as for pack_pairs_bf16.
template <DType kW>
DC_TARGET_AVX512 void pack_f32(const void* w, int64_t ldw, int64_t nj, int64_t k0, int64_t kc, const void* next,
                               float* dst) {
  constexpr int64_t kSize = kW == DType::kF32 ? 4 : 2;
  for (int v = 0; v < kNv; ++v) {
    for (int64_t kk = 0; kk < kc; kk += 16) {
      const __mmask16 m = mask16(kc - kk);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t row = 16 * v + i;
        if (next && (kk * kSize) % 64 == 0)
          _mm_prefetch(static_cast<const char*>(next) + (row * ldw + kk) * kSize, _MM_HINT_T1);
        r[i] = row < nj ? _mm512_castps_si512(load_w16<kW>(w, row * ldw + k0 + kk, m)) : _mm512_setzero_si512();
      }
      simd::transpose16x16_epi32(r);
      const int64_t nt = std::min<int64_t>(16, kc - kk);
      for (int64_t t = 0; t < nt; ++t) _mm512_store_si512(dst + (kk + t) * kPanel + 16 * v, r[t]);
    }
  }
}

// f32 from a kPanels panel (pairs of k for 64 rows): dst[t * 64 + c] = w[c, k0 + t] for t < kc; k0 even.
DC_TARGET_AVX512 void unpack_pairs_f32(const uint32_t* panel, int64_t k0, int64_t kc, float* dst) {
  const uint32_t* src = panel + (k0 / 2) * kPanel;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t t = 0; t < kc; t += 2)
    for (int v = 0; v < kNv; ++v) {
      const __m512i w = _mm512_load_si512(src + (t / 2) * kPanel + 16 * v);
      _mm512_store_ps(dst + t * kPanel + 16 * v, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      if (t + 1 < kc) _mm512_store_ps(dst + (t + 1) * kPanel + 16 * v, _mm512_castsi512_ps(_mm512_and_si512(w, high)));
    }
}

// ---- micro-kernels: c[MR, 64] (first `cols` columns stored, row stride ldc) ----

// c = init + a · b, a: [MR, kc] f32 (row stride lda), b: [kc, 64] packed f32.
template <int MR>
DC_TARGET_AVX512 void micro_f32(int64_t kc, const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                                int64_t cols, Init init, const float* bias) {
  __mmask16 mk[kNv];
  for (int v = 0; v < kNv; ++v) mk[v] = mask16(cols - 16 * v);
  __m512 acc[MR][kNv];
  init_acc<MR>(acc, mk, init, bias, c, ldc);
  for (int64_t t = 0; t < kc; ++t) {
    __m512 bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm512_load_ps(b + t * kPanel + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * lda + t]);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
  store_acc<MR>(acc, mk, c, ldc);
}

// ---- small n: y[i, j] = Σ_t x[i, t] w[j, t] over whole rows, MR rows of x × NR rows of W ----

DC_TARGET_AVX512 DC_INLINE float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// y = hsum (+ bias), or y += hsum when accumulating.
DC_INLINE void put(float* y, float sum, const float* bias, bool accumulate) {
  *y = accumulate ? *y + sum : sum + (bias ? *bias : 0.0f);
}

template <int MR, int NR>
DC_TARGET_AVX512_BF16 void dot_bf16(int64_t k, const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw,
                                    const float* bias, float* y, int64_t ldy, bool accumulate) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < k; t += 32) {
    const __mmask32 m = mask32(k - t);
    __m512bh wv[NR], xv[MR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const char* at = reinterpret_cast<const char*>(w + j * ldw + t);
      _mm_prefetch(at + kPrefetch, _MM_HINT_T0);        // this row, a few iterations ahead
      _mm_prefetch(at + NR * ldw * 2, _MM_HINT_T1);     // the same place in the next group of rows
      wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * ldw + t);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xv[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, x + r * ldx + t);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv[r], wv[j]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) put(y + r * ldy + j, hsum(acc[r][j]), bias ? bias + j : nullptr, accumulate);
}

template <DType kW, int MR, int NR>
DC_TARGET_AVX512 void dot_f32(int64_t k, const float* x, int64_t ldx, const void* w, int64_t ldw,
                              const float* bias, float* y, int64_t ldy, bool accumulate) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < k; t += 16) {
    const __mmask16 m = mask16(k - t);
    __m512 wv[NR], xv[MR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      constexpr int64_t kSize = kW == DType::kF32 ? 4 : 2;
      const char* at = static_cast<const char*>(w) + (j * ldw + t) * kSize;
      _mm_prefetch(at + kPrefetch, _MM_HINT_T0);
      _mm_prefetch(at + NR * ldw * kSize, _MM_HINT_T1);
      wv[j] = load_w16<kW>(w, j * ldw + t, m);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_maskz_loadu_ps(m, x + r * ldx + t);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[r][j] = _mm512_fmadd_ps(xv[r], wv[j], acc[r][j]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) put(y + r * ldy + j, hsum(acc[r][j]), bias ? bias + j : nullptr, accumulate);
}

// ---- drivers ----

// Rows [i0, i1) of x to bf16 (round to nearest even), zero-padded to ldxb columns.
DC_TARGET_AVX512_BF16 void convert_rows_bf16(const float* x, int64_t k, int64_t i0, int64_t i1, uint16_t* xb,
                                             int64_t ldxb) {
  for (int64_t i = i0; i < i1; ++i) {
    simd::round_row_bf16(x + i * k, k, ldxb, xb + i * ldxb);
  }
}


struct Job {
  const float* x;        // [n, k]
  uint16_t* xb;          // [n, ldxb] x rounded to bf16 (bf16 precision only), zero-padded to even k
  int64_t ldxb;
  // Per block of kConvRows rows of xb: 0 = not converted, 1 = being converted, 2 = ready. The tasks
  // convert the blocks they need themselves (whoever comes first), so no extra pass over the pool.
  std::atomic<uint8_t>* conv_state;
  int64_t n, m, k;
  const WeightView* w;   // [m, k]
  const float* bias;     // [m] or null
  float* y;              // [n, m]
  bool bf16;             // bf16 precision through the bf16 kernels (bf16 weights, or f16 ones split)
  bool f16;              // f16 weights at bf16 precision: hi / lo panels (pack_f16.h)
  bool amx;              // bf16 with AMX: 32-row blocks through tiles (k a multiple of 32)
  bool accumulate;       // y += x·Wᵀ (no bias)
  bool panels;           // w is in the kPanels layout
  bool panels_t;         // w is kPanelsTransposed (bf16 precision): each block re-paired as it is packed
  int64_t panel_words;   // kPanels: words per panel, ⌈k/2⌉ · 64
  Workspace* ws;         // the per-thread panel buffers
};

template <int MR>
void run_micro(const Job& j, int64_t i, int64_t j0, int64_t cols, int64_t k0, int64_t kc, const void* panel,
               Init init) {
  float* c = j.y + i * j.m + j0;
  const float* bias = j.bias ? j.bias + j0 : nullptr;
  if (j.bf16) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(j.xb + i * j.ldxb + k0);
    const uint32_t* b = static_cast<const uint32_t*>(panel);
    micro_bf16<MR>((kc + 1) / 2, a, j.ldxb / 2, b, c, j.m, cols, init, bias);
    if (j.f16) micro_bf16<MR>((kc + 1) / 2, a, j.ldxb / 2, b + kLoPanel, c, j.m, cols, Init::kLoad, nullptr);
  } else {
    micro_f32<MR>(kc, j.x + i * j.k + k0, j.k, static_cast<const float*>(panel), c, j.m, cols, init, bias);
  }
}

// Packs rows [j0, j0 + nj) × columns [k0, k0 + kc) of W; prefetches the block at (next_j0, next_k0)
// unless next_j0 < 0. Returns the panel the micro-kernels read: `panel` (f16 at bf16 precision: hi, with
// lo kLoPanel words after it), or for kPanels weights at bf16 precision the block in place.
const void* pack_panel(const Job& j, int64_t j0, int64_t nj, int64_t k0, int64_t kc, int64_t next_j0,
                       int64_t next_k0, void* panel) {
  const WeightView& w = *j.w;
  if (j.panels_t) {
    pack_pairs_transposed(static_cast<const uint32_t*>(w.data), (w.rows + 1) / 2, j0, k0, kc, static_cast<uint32_t*>(panel));
    return panel;
  }
  if (j.panels) {
    const uint32_t* src = static_cast<const uint32_t*>(w.data) + j0 / kPanel * j.panel_words;
    if (j.bf16) return src + (k0 / 2) * kPanel;
    unpack_pairs_f32(src, k0, kc, static_cast<float*>(panel));
    return panel;
  }
  const int64_t size = static_cast<int64_t>(dtype_size(w.dtype));
  const char* rows = static_cast<const char*>(w.data) + j0 * w.cols * size;
  const char* next = next_j0 < 0 ? nullptr : static_cast<const char*>(w.data) + (next_j0 * w.cols + next_k0) * size;
  float* dst = static_cast<float*>(panel);
  if (j.f16)
    pack_pairs_f16_split(reinterpret_cast<const uint16_t*>(rows), w.cols, nj, k0, kc,
                         reinterpret_cast<const uint16_t*>(next), static_cast<uint32_t*>(panel),
                         static_cast<uint32_t*>(panel) + kLoPanel);
  else if (j.bf16)
    pack_pairs_bf16(reinterpret_cast<const uint16_t*>(rows), w.cols, nj, k0, kc,
                    reinterpret_cast<const uint16_t*>(next), static_cast<uint32_t*>(panel));
  else if (w.dtype == DType::kBF16) pack_f32<DType::kBF16>(rows, w.cols, nj, k0, kc, next, dst);
  else if (w.dtype == DType::kF16) pack_f32<DType::kF16>(rows, w.cols, nj, k0, kc, next, dst);
  else pack_f32<DType::kF32>(rows, w.cols, nj, k0, kc, next, dst);
  return panel;
}

// Makes rows [i0, i1) of j.xb ready: converts the blocks no other thread has claimed, then waits for
// the ones being converted elsewhere (a few microseconds of work each).
void ensure_converted(const Job& j, int64_t i0, int64_t i1) {
  const int64_t b0 = i0 / kConvRows, b1 = (i1 + kConvRows - 1) / kConvRows;
  for (int64_t b = b0; b < b1; ++b) {
    uint8_t expected = 0;
    if (j.conv_state[b].compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
      convert_rows_bf16(j.x, j.k, b * kConvRows, std::min(j.n, (b + 1) * kConvRows), j.xb, j.ldxb);
      j.conv_state[b].store(2, std::memory_order_release);
    }
  }
  for (int64_t b = b0; b < b1; ++b)
    for (int spins = 0; j.conv_state[b].load(std::memory_order_acquire) != 2; ++spins)
      if (spins > 1000) std::this_thread::yield();
}

// Rows [i0, i1) × panels [p0, p1) of y: per panel, per k block, pack once and sweep all rows.
void packed_task(const Job& j, int64_t i0, int64_t i1, int64_t p0, int64_t p1) {
  if (j.bf16) ensure_converted(j, i0, i1);
  if (j.amx) amx_configure();
  const int64_t kc_max = j.bf16 ? kKcBf16 : kKcF32;
  // 128 KiB (f16 at bf16 precision: hi and lo, 256 KiB)
  void* panel =
      j.ws->thread_buffer<uint32_t>("matmul.panel", j.f16 ? 2 * kLoPanel : (j.bf16 ? kc_max / 2 : kc_max) * kPanel);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t j0 = p * kPanel, cols = std::min(kPanel, j.m - j0);
    for (int64_t k0 = 0; k0 < j.k; k0 += kc_max) {
      const int64_t kc = std::min(kc_max, j.k - k0);
      int64_t next_j0 = j0, next_k0 = k0 + kc;  // the block packed after this one, if any
      if (next_k0 >= j.k) next_j0 = j0 + kPanel < j.m ? j0 + kPanel : -1, next_k0 = 0;  // maybe another task's
      const void* b = pack_panel(j, j0, cols, k0, kc, next_j0, next_k0, panel);
      // kPanels at bf16 precision: the next block of this task (contiguous after this one) is fetched
      // into L2 a slice before each micro-kernel call, so memory streams while the FMAs run.
      const char* ahead = nullptr;
      int64_t ahead_lines = 0, lines_per_call = 0;
      if (j.panels && j.bf16 && (k0 + kc < j.k || p + 1 < p1)) {
        ahead = static_cast<const char*>(b) + (kc + 1) / 2 * kPanel * 4;
        const int64_t next_kc = k0 + kc < j.k ? std::min(kc_max, j.k - k0 - kc) : std::min(kc_max, j.k);
        ahead_lines = (next_kc + 1) / 2 * kPanel * 4 / 64;
        lines_per_call = ceil_div(ahead_lines, ceil_div(i1 - i0, kMr));
      }
      auto prefetch_slice = [&] {
        for (int64_t l = 0; l < lines_per_call && ahead_lines > 0; ++l, --ahead_lines, ahead += 64)
          _mm_prefetch(ahead, _MM_HINT_T1);
      };
      const Init init = k0 > 0 || j.accumulate ? Init::kLoad : (j.bias ? Init::kBias : Init::kZero);
      int64_t i = i0;
      if (j.amx) {  // 32 rows at a time through the tiles, in two halves of the panel's columns
        const uint32_t* a = reinterpret_cast<const uint32_t*>(j.xb + k0);
        for (; i + 32 <= i1; i += 32)
          for (int64_t h = 0; h < cols; h += 32) {
            float* c = j.y + i * j.m + j0 + h;
            const int64_t nc = std::min<int64_t>(32, cols - h);
            micro_amx((kc + 1) / 2, a + i * (j.ldxb / 2), j.ldxb / 2, static_cast<const uint32_t*>(b) + h, c, j.m, nc,
                      init, j.bias ? j.bias + j0 + h : nullptr);
            if (j.f16)
              micro_amx((kc + 1) / 2, a + i * (j.ldxb / 2), j.ldxb / 2, static_cast<const uint32_t*>(b) + kLoPanel + h,
                        c, j.m, nc, Init::kLoad, nullptr);
          }
      }
      for (; i + kMr <= i1; i += kMr) prefetch_slice(), run_micro<kMr>(j, i, j0, cols, k0, kc, b, init);
      prefetch_slice();
      switch (i1 - i) {
        case 5: run_micro<5>(j, i, j0, cols, k0, kc, b, init); break;
        case 4: run_micro<4>(j, i, j0, cols, k0, kc, b, init); break;
        case 3: run_micro<3>(j, i, j0, cols, k0, kc, b, init); break;
        case 2: run_micro<2>(j, i, j0, cols, k0, kc, b, init); break;
        case 1: run_micro<1>(j, i, j0, cols, k0, kc, b, init); break;
        default: break;
      }
    }
  }
  if (j.amx) amx_release();
}

// Rows [i0, i0 + MR) of y × rows [r, r + NR) of W.
template <int MR, int NR>
void run_dot(const Job& j, int64_t i0, int64_t r) {
  const float* bias = j.bias ? j.bias + r : nullptr;
  const WeightView& w = *j.w;
  const char* wr = static_cast<const char*>(w.data) + r * w.cols * dtype_size(w.dtype);
  float* y = j.y + i0 * j.m + r;
  if (j.bf16 && !j.f16)
    return dot_bf16<MR, NR>(j.k, j.xb + i0 * j.ldxb, j.ldxb, reinterpret_cast<const uint16_t*>(wr), w.cols, bias, y,
                            j.m, j.accumulate);
  const float* x = j.x + i0 * j.k;
  if (w.dtype == DType::kBF16) return dot_f32<DType::kBF16, MR, NR>(j.k, x, j.k, wr, w.cols, bias, y, j.m, j.accumulate);
  if (w.dtype == DType::kF16) return dot_f32<DType::kF16, MR, NR>(j.k, x, j.k, wr, w.cols, bias, y, j.m, j.accumulate);
  return dot_f32<DType::kF32, MR, NR>(j.k, x, j.k, wr, w.cols, bias, y, j.m, j.accumulate);
}

template <int MR>
void dot_rows(const Job& j, int64_t i0, int64_t r0, int64_t r1) {
  int64_t r = r0;
  constexpr int kNr = MR <= 2 ? 8 : MR <= 5 ? 4 : MR <= 7 ? 3 : 2;  // MR · kNr <= 21 accumulators
  for (; r + kNr <= r1; r += kNr) run_dot<MR, kNr>(j, i0, r);
  for (; r < r1; ++r) run_dot<MR, 1>(j, i0, r);
}

// All n rows of y × rows [r0, r1) of W: per 16 rows of W (kept in L1/L2), the rows of x
// in groups of up to 8.
void dot_task(const Job& j, int64_t r0, int64_t r1) {
  for (int64_t c0 = r0; c0 < r1; c0 += 16) {
    const int64_t c1 = std::min(r1, c0 + 16);
    for (int64_t i0 = 0; i0 < j.n; i0 += 8) {
      switch (std::min<int64_t>(8, j.n - i0)) {
        case 1: dot_rows<1>(j, i0, c0, c1); break;
        case 2: dot_rows<2>(j, i0, c0, c1); break;
        case 3: dot_rows<3>(j, i0, c0, c1); break;
        case 4: dot_rows<4>(j, i0, c0, c1); break;
        case 5: dot_rows<5>(j, i0, c0, c1); break;
        case 6: dot_rows<6>(j, i0, c0, c1); break;
        case 7: dot_rows<7>(j, i0, c0, c1); break;
        default: dot_rows<8>(j, i0, c0, c1); break;
      }
    }
  }
}

}  // namespace

void matmul_nt_fast(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w, const float* bias,
                    float* y, MatmulPrecision precision, bool accumulate) {
  if (!cpu_has_avx512()) return matmul_nt(pool, x, n, w, bias, y, accumulate);
  if (n == 0) return;
  const int64_t m = w.rows, k = w.cols;
  Job job{x, nullptr, 0, nullptr, n, m, k, &w, bias, y, false, false, false, accumulate, false, false, 0, &ws};
  job.panels = w.layout == WeightLayout::kPanels;
  job.panel_words = (k + 1) / 2 * kPanel;
  // kPanels weights need the bf16 pair kernel (or the f32 one, which unpacks them) and not the dot path.
  job.bf16 = precision == MatmulPrecision::kBF16 && (w.dtype == DType::kBF16 || w.dtype == DType::kF16) &&
             cpu_has_avx512_bf16();
  job.f16 = job.bf16 && w.dtype == DType::kF16;
  // kPanelsTransposed is re-paired for the bf16 pair kernel only; at f32 precision the reference kernel.
  job.panels_t = w.layout == WeightLayout::kPanelsTransposed;
  if (job.panels_t && !job.bf16) return matmul_nt(pool, x, n, w, bias, y, accumulate);
  job.amx = job.bf16 && k % 32 == 0 && n >= 32 && cpu_has_amx_bf16();
  const int64_t threads = pool ? pool->n_threads() : 1;
  const bool tiny = n * m * k < (int64_t{1} << 18);  // not worth waking the pool
  ThreadPool* p = tiny ? nullptr : pool;

  const bool dot = !job.panels && !job.panels_t && (n <= kSmallN || (n <= kSmallNShortK && k <= kShortK));
  std::vector<std::atomic<uint8_t>> conv_state(job.bf16 ? ceil_div(n, kConvRows) : 0);
  if (job.f16 && dot) {  // the f32 dot-product kernels over f16 weights, x rounded to bf16 once
    float* rounded = ws.thread_buffer<float>("matmul.x_rounded", n * k);
    for (int64_t i = 0; i < n * k; ++i) rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
    job.x = rounded;
  } else if (job.bf16) {
    job.ldxb = (k + 31) / 32 * 32;  // whole 32-lane stores; the pad is zero
    job.xb = ws.thread_buffer<uint16_t>("matmul.x_bf16", n * job.ldxb);
    job.conv_state = conv_state.data();
    if (dot) convert_rows_bf16(x, k, 0, n, job.xb, job.ldxb);
  }

  // Tasks are handed out through an atomic counter (one pool chunk per thread), so they can be finer
  // than the pool's own chunks: ~16 per thread keeps the threads' finishing times within a few percent.
  const int64_t target = (p && threads > 1) ? 16 * threads : 1;
  auto run_tasks = [&](int64_t n_tasks, const std::function<void(int64_t)>& task) {
    std::atomic<int64_t> next{0};
    parallel_for(p, std::min(threads, n_tasks), [&](int64_t, int64_t) {
      for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n_tasks;) task(t);
    });
  };
  if (dot) {
    const int64_t units = ceil_div(m, 16);  // W rows in groups of 16
    const int64_t n_tasks = std::min(units, target);
    run_tasks(n_tasks, [&](int64_t t) {
      dot_task(job, std::min(m, units * t / n_tasks * 16), std::min(m, units * (t + 1) / n_tasks * 16));
    });
    return;
  }
  // Tasks: row blocks × groups of panels. Rows are split only where there are too few panels for the
  // threads, and into blocks of at least kMinRowBlock rows (each row block packs its panels again).
  const int64_t panels = ceil_div(m, kPanel);
  const int64_t col_tasks = std::min(panels, target);
  int64_t row_blocks = ceil_div(n, kMaxRowBlock);
  if (panels < 4 * threads)
    row_blocks = std::max(row_blocks, std::min(ceil_div(4 * threads, panels), ceil_div(n, kMinRowBlock)));
  // Whole micro-tiles per block; with AMX whole 32-row tile blocks, so that which rows go through the
  // tiles (and so their summation order) does not depend on the thread count.
  const int64_t unit = job.amx ? 96 : kMr;
  const int64_t row_block = ceil_div(ceil_div(n, row_blocks), unit) * unit;
  row_blocks = ceil_div(n, row_block);
  run_tasks(row_blocks * col_tasks, [&](int64_t t) {
    const int64_t ct = t / row_blocks, rb = t % row_blocks;
    packed_task(job, rb * row_block, std::min(n, (rb + 1) * row_block), panels * ct / col_tasks,
                panels * (ct + 1) / col_tasks);
  });
}

void pack_panels_bf16(ThreadPool* pool, const WeightView& w, int64_t panel_begin, int64_t panel_end, uint32_t* out) {
  const int64_t words = (w.cols + 1) / 2 * kPanel;
  const bool fast = cpu_has_avx512();
  parallel_for(pool, panel_end - panel_begin, [&](int64_t b, int64_t e) {
    for (int64_t P = panel_begin + b; P < panel_begin + e; ++P) {
      const int64_t j0 = P * kPanel, nj = std::min(kPanel, w.rows - j0);
      const uint16_t* rows = static_cast<const uint16_t*>(w.data) + j0 * w.cols;
      uint32_t* dst = out + P * words;
      if (fast) {
        pack_pairs_bf16(rows, w.cols, nj, 0, w.cols, nullptr, dst);
        continue;
      }
      for (int64_t pp = 0; pp < words / kPanel; ++pp)
        for (int64_t c = 0; c < kPanel; ++c) {
          const uint32_t lo = c < nj ? rows[c * w.cols + 2 * pp] : 0;
          const uint32_t hi = c < nj && 2 * pp + 1 < w.cols ? rows[c * w.cols + 2 * pp + 1] : 0;
          dst[pp * kPanel + c] = lo | hi << 16;
        }
    }
  });
}

}  // namespace dc::cpu
