// The fused AdamW update + bf16 re-layout of one matrix (ops/adamw.h), AVX512_BF16. Per strip of 16
// rows: each row is updated (adamw_value, vectorised by the compiler) and rounded to bf16 into a strip
// buffer while it is in cache; the strip is then written as W panels (16×16 transposes of bf16 pairs:
// one 64-byte line per pair of columns), the one copy (the backward reads it as Wᵀ in place).
// Strips past the last row write the panels' zero padding, so the copy is complete whatever the
// buffers held before. The panels are written with streaming stores (whole 64-byte lines, not read
// first: the copies are far larger than the caches and read only by the next step's GEMMs).
#include <algorithm>
#include <cstring>

#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

constexpr int64_t kStrip = 16;  // rows per strip: one 16×16 transpose of 32-bit pairs

// Rows [r0, r0 + 16) of the strip, bf16 in buf [16, ld] (rows past `rows` zero): W panel words
// (P·pairs + pp)·64 + r % 64 for every pair pp of columns.
DC_TARGET_AVX512 void write_w_panels(const uint16_t* buf, int64_t ld, int64_t r0, int64_t cols, uint32_t* out) {
  const int64_t pairs = (cols + 1) / 2;
  uint32_t* base = out + (r0 / kPanelRows) * pairs * kPanelRows + r0 % kPanelRows;
  for (int64_t pp0 = 0; pp0 < pairs; pp0 += 16) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(buf + i * ld + 2 * pp0);
    simd::transpose16x16_epi32(r);  // r[t] lane i: pair pp0 + t of row r0 + i
    const int64_t nt = std::min<int64_t>(16, pairs - pp0);
    for (int64_t t = 0; t < nt; ++t) _mm512_stream_si512(reinterpret_cast<__m512i*>(base + (pp0 + t) * kPanelRows), r[t]);
  }
}

DC_TARGET_AVX512_BF16 void strip(const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t r0,
                                 int64_t rows, int64_t cols, int64_t ld, uint16_t* buf, uint32_t* w_panels) {
  for (int64_t i = 0; i < kStrip; ++i) {
    const int64_t r = r0 + i;
    if (r >= rows) {
      std::memset(buf + i * ld, 0, static_cast<size_t>(ld) * 2);
      continue;
    }
    float* pr = p + r * cols;
    const float* gr = g + r * cols;
    float* mr = m + r * cols;
    float* vr = v + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) adamw_value(s, pr[c], gr[c], mr[c], vr[c]);
    simd::round_row_bf16(pr, cols, ld, buf + i * ld);
  }
  if (w_panels != nullptr) write_w_panels(buf, ld, r0, cols, w_panels);
}

}  // namespace

void adamw_update_panels_fast(ThreadPool* pool, Workspace& ws, const AdamWStep& s, float* p, const float* g, float* m, float* v,
                              int64_t rows, int64_t cols, uint32_t* w_panels) {
  // Every strip of every W panel, the zero rows of the last one included; ld covers whole 16-pair loads
  // of W's pairs.
  const int64_t n_strips = (rows + kPanelRows - 1) / kPanelRows * (kPanelRows / kStrip);
  const int64_t ld = (cols + 31) / 32 * 32;
  parallel_for(pool, n_strips, [&](int64_t b, int64_t e) {
    uint16_t* buf = ws.thread_buffer<uint16_t>("adamw.strip", kStrip * ld);  // [16, ld] the strip in bf16
    for (int64_t st = b; st < e; ++st) strip(s, p, g, m, v, st * kStrip, rows, cols, ld, buf, w_panels);
    _mm_sfence();  // the streaming stores are visible before the pool reports the range done
  });
}

}  // namespace dc::cpu
