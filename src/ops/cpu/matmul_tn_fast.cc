// Fast CPU y[m, k] (+)= aᵀ · b over bf16 operands with f32 sums (the backward's dW = dyᵀ·x), reading a
// [n, m] and b [n, k] in the layout they have: the sum runs over their rows (tokens), which the bf16
// kernels want as pairs inside 32-bit words. Per task (rows [i0, i1) of y × panels of 64 columns) and
// block of kKcPairs pairs of rows of a and b:
//   - a's block is packed transposed, aᵀ pairs [i1 − i0, pairs] (row r: (a[2p, r], a[2p + 1, r])), by
//     16 × 16 word transposes of the rounded pairs: the A operand of the AMX tiles / broadcast kernel;
//   - each panel of b is packed without a transpose, pair p of column c at word p · 64 + c: two rows of
//     b rounded and interleaved, the VNNI layout the tiles and vdpbf16ps read.
// The pairs are zero-padded to a multiple of 16, so every shape goes through the tiles where AMX is
// allowed (32-row groups; rows past the last whole group through the AVX512_BF16 kernel). Each output is
// summed in the same order whatever the thread count.
#include <algorithm>
#include <atomic>

#include "ops/cpu/gemm_bf16_micro.h"
#include "ops/cpu/kernels.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using gemm::Init;
using gemm::kPanel;
using simd::mask16;

constexpr int kMr = 6;               // rows of y per AVX512_BF16 micro-tile
constexpr int kAmxRows = 32;         // rows of y per AMX tile block
constexpr int64_t kKcPairs = 512;    // pairs of rows per block: a panel of b is 128 KiB
constexpr int64_t kRowUnit = 96;     // row blocks are whole AMX blocks and whole micro-tiles
constexpr int64_t kMaxRowBlock = 480;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 16 words (lo[c], hi[c]) as bf16 pairs, lo in the low half (rounded to nearest even).
DC_TARGET_AVX512_BF16 DC_INLINE __m512i pair_bf16(__m512 lo, __m512 hi) {
  const __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
  const __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi));
  return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

// 16 columns [c0, c0 + 16) of rows 2p and 2p + 1 of x [n, ld] as pairs (zero past n and past `cols`).
DC_TARGET_AVX512_BF16 DC_INLINE __m512i load_pair_row(const float* x, int64_t n, int64_t ld, int64_t p, int64_t c0,
                                                       int64_t cols) {
  const __mmask16 m = mask16(cols - c0);
  const int64_t t = 2 * p;
  const __m512 lo = t < n ? _mm512_maskz_loadu_ps(m, x + t * ld + c0) : _mm512_setzero_ps();
  const __m512 hi = t + 1 < n ? _mm512_maskz_loadu_ps(m, x + (t + 1) * ld + c0) : _mm512_setzero_ps();
  return pair_bf16(lo, hi);
}

// dst[(r − r0) · lda + (p − p0)] = (a[2p, r], a[2p + 1, r]) for r in [r0, r1), p in [p0, p0 + np16), np16 a
// multiple of 16; pairs past n are zero. a: [n, m].
DC_TARGET_AVX512_BF16 void pack_a_transposed(const float* a, int64_t n, int64_t m, int64_t r0, int64_t r1, int64_t p0,
                                             int64_t np16, uint32_t* dst, int64_t lda) {
  for (int64_t c = r0; c < r1; c += 16) {
    const int64_t nr = std::min<int64_t>(16, r1 - c);
    for (int64_t pp = 0; pp < np16; pp += 16) {
      __m512i v[16];
      for (int i = 0; i < 16; ++i) v[i] = load_pair_row(a, n, m, p0 + pp + i, c, std::min(m, r1));
      simd::transpose16x16_epi32(v);  // v[r] = the 16 pairs of row c + r
      for (int64_t r = 0; r < nr; ++r) _mm512_storeu_si512(dst + (c - r0 + r) * lda + pp, v[r]);
    }
  }
}

// dst[p · 64 + c] = (b[2(p0 + p), j0 + c], b[2(p0 + p) + 1, j0 + c]) for p < np16, c < 64; zero past n and
// past column k. b: [n, k].
DC_TARGET_AVX512_BF16 void pack_b_panel(const float* b, int64_t n, int64_t k, int64_t j0, int64_t p0, int64_t np16,
                                        uint32_t* dst) {
  for (int64_t p = 0; p < np16; ++p)
    for (int v = 0; v < gemm::kNv; ++v)
      _mm512_store_si512(dst + p * kPanel + 16 * v, load_pair_row(b, n, k, p0 + p, j0 + 16 * v, k));
}

struct Job {
  const float* a;  // [n, m]
  const float* b;  // [n, k]
  float* y;        // [m, k]
  int64_t n, m, k;
  bool amx;
  bool accumulate;  // false: the first block of pairs overwrites y
  Workspace* ws;
};

template <int MR>
void run_micro(const uint32_t* a, int64_t lda, const uint32_t* panel, int64_t np16, float* c, int64_t ldc,
               int64_t cols, Init init) {
  gemm::micro_bf16<MR>(np16, a, lda, panel, c, ldc, cols, init, nullptr);
}

// Rows [i0, i1) × panels [q0, q1) of y.
DC_TARGET_AVX512 void task(const Job& j, int64_t i0, int64_t i1, int64_t q0, int64_t q1) {
  const int64_t pairs = ceil_div(j.n, 2);
  uint32_t* apk = j.ws->thread_buffer<uint32_t>("matmul_tn.a", kMaxRowBlock * kKcPairs);
  uint32_t* bpk = j.ws->thread_buffer<uint32_t>("matmul_tn.b", kKcPairs * kPanel);
  if (j.amx) gemm::amx_configure();
  for (int64_t p0 = 0; p0 < pairs; p0 += kKcPairs) {
    const int64_t np16 = (std::min(kKcPairs, pairs - p0) + 15) / 16 * 16, lda = np16;
    const Init init = p0 == 0 && !j.accumulate ? Init::kZero : Init::kLoad;
    pack_a_transposed(j.a, j.n, j.m, i0, i1, p0, np16, apk, lda);
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t j0 = q * kPanel, cols = std::min(kPanel, j.k - j0);
      // Overwriting y: each 32-row group's lines are loaded before its tiles are stored, as kLoad does.
      // AMX tile stores to lines not in the cache made the overwrite ~1.3x slower than loading y and
      // adding (measured on the 0.5B dW shapes; write prefetches did not help, plain loads do).
      auto load_rows = [&](int64_t r0) DC_TARGET_AVX512 {  // (a lambda has no target of its own)
        if (init != Init::kZero) return;
        __m512 sink = _mm512_setzero_ps();
        for (int64_t r = r0; r < std::min(i1, r0 + kAmxRows); ++r)
          for (int64_t c = 0; c < cols; c += 16)
            sink = _mm512_or_ps(sink, _mm512_maskz_loadu_ps(mask16(cols - c), j.y + r * j.k + j0 + c));
        asm volatile("" : : "v"(sink));  // the loads are kept
      };
      pack_b_panel(j.b, j.n, j.k, j0, p0, np16, bpk);
      int64_t i = i0;
      if (j.amx)
        for (; i + kAmxRows <= i1; i += kAmxRows) {
          load_rows(i);
          for (int64_t h = 0; h < cols; h += 32)
            gemm::micro_amx(np16, apk + (i - i0) * lda, lda, bpk + h, j.y + i * j.k + j0 + h, j.k,
                            std::min<int64_t>(32, cols - h), init, nullptr);
        }
      for (; i + kMr <= i1; i += kMr) run_micro<kMr>(apk + (i - i0) * lda, lda, bpk, np16, j.y + i * j.k + j0, j.k, cols, init);
      const uint32_t* at = apk + (i - i0) * lda;
      float* c = j.y + i * j.k + j0;
      switch (i1 - i) {
        case 5: run_micro<5>(at, lda, bpk, np16, c, j.k, cols, init); break;
        case 4: run_micro<4>(at, lda, bpk, np16, c, j.k, cols, init); break;
        case 3: run_micro<3>(at, lda, bpk, np16, c, j.k, cols, init); break;
        case 2: run_micro<2>(at, lda, bpk, np16, c, j.k, cols, init); break;
        case 1: run_micro<1>(at, lda, bpk, np16, c, j.k, cols, init); break;
        default: break;
      }
    }
  }
  if (j.amx) gemm::amx_release();
}

}  // namespace

void matmul_tn_fast(ThreadPool* pool, Workspace& ws, const float* a, int64_t n, int64_t m, const float* b, int64_t k,
                    float* y, bool accumulate) {
  if (m == 0 || k == 0) return;
  if (n == 0) {
    if (!accumulate) std::fill(y, y + m * k, 0.0f);
    return;
  }
  const Job job{a, b, y, n, m, k, cpu_has_amx_bf16(), accumulate, &ws};
  const int64_t threads = pool ? pool->n_threads() : 1;
  // Row blocks as tall as the A buffer allows (whole kRowUnit rows, so which rows take the tiles does not
  // depend on the split): every row block packs each panel of b again, while every split of the panels
  // packs its rows of a again, and b's panels are the cheaper to repeat only when there are few. The
  // panels are split only where the row blocks alone leave fewer than 2 tasks per thread.
  const int64_t row_block = std::min(kMaxRowBlock, ceil_div(m, kRowUnit) * kRowUnit);
  const int64_t row_blocks = ceil_div(m, row_block), panels = ceil_div(k, kPanel);
  const int64_t col_tasks = std::min(panels, ceil_div(2 * threads, row_blocks));
  const int64_t n_tasks = row_blocks * col_tasks;
  std::atomic<int64_t> next{0};
  ThreadPool* p = m * k * n < (int64_t{1} << 18) ? nullptr : pool;  // not worth waking the pool
  parallel_for(p, std::min(threads, n_tasks), [&](int64_t, int64_t) {
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n_tasks;) {
      const int64_t rb = t % row_blocks, ct = t / row_blocks;
      task(job, rb * row_block, std::min(m, (rb + 1) * row_block), panels * ct / col_tasks,
           panels * (ct + 1) / col_tasks);
    }
  });
}

}  // namespace dc::cpu
