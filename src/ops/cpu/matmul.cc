// CPU matmul_nt: weights converted to f32 one block of rows at a time (never the whole matrix), then a
// 4×4 register-tiled dot-product kernel. f32 accumulation. Reference speed, not peak speed.
#include <algorithm>
#include <vector>

#include "core/kernel_variant.h"
#include "ops/cpu/kernels.h"

namespace dc::cpu {
DC_KERNEL_VARIANT_BEGIN  // baseline:: here, avx2:: in kernels_avx2.cc
namespace {

constexpr int64_t kBlockRows = 32;  // weight rows converted and reused per task

// y[i, j] for x rows [i0, i0+4) and w rows [j0, j0+4) of a block; full 4×4 tile.
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

}  // namespace

void matmul_nt(ThreadPool* pool, const float* x, int64_t n, const WeightView& w, const float* bias, float* y,
               bool accumulate) {
  const int64_t m = w.rows, k = w.cols;
  auto put = [&](int64_t i, int64_t j, float sum) { y[i * m + j] = accumulate ? y[i * m + j] + sum : sum; };
  const int64_t n_blocks = (m + kBlockRows - 1) / kBlockRows;
  parallel_for(pool, n_blocks, [&](int64_t b_begin, int64_t b_end) {
    std::vector<float> wbuf(w.dtype == DType::kF32 ? 0 : kBlockRows * k);
    for (int64_t blk = b_begin; blk < b_end; ++blk) {
      const int64_t j0 = blk * kBlockRows, nj = std::min(kBlockRows, m - j0);
      const float* wf;
      if (w.dtype == DType::kF32) {
        wf = static_cast<const float*>(w.data) + j0 * k;
      } else {
        for (int64_t r = 0; r < nj; ++r) w.row_to_f32(j0 + r, wbuf.data() + r * k);
        wf = wbuf.data();
      }
      const int64_t nj4 = nj & ~int64_t{3}, n4 = n & ~int64_t{3};
      float tile[16];
      for (int64_t i = 0; i < n4; i += 4) {
        for (int64_t j = 0; j < nj4; j += 4) {
          tile4x4(x + i * k, k, wf + j * k, k, tile);
          for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 4; ++b) put(i + a, j0 + j + b, tile[a * 4 + b]);
        }
        for (int64_t j = nj4; j < nj; ++j)
          for (int a = 0; a < 4; ++a) put(i + a, j0 + j, dot(x + (i + a) * k, wf + j * k, k));
      }
      for (int64_t i = n4; i < n; ++i)
        for (int64_t j = 0; j < nj; ++j) put(i, j0 + j, dot(x + i * k, wf + j * k, k));
      if (bias != nullptr)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < nj; ++j) y[i * m + j0 + j] += bias[j0 + j];
    }
  });
}

void matmul_tn(ThreadPool* pool, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y,
               bool accumulate) {
  parallel_for(pool, m, [&](int64_t i0, int64_t i1) {
    std::vector<float> row(static_cast<size_t>(k));  // [k] the sums of row i, over t in order
    for (int64_t i = i0; i < i1; ++i) {
      std::fill(row.begin(), row.end(), 0.0f);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < k; ++j) row[j] += a[t * m + i] * b[t * k + j];
      for (int64_t j = 0; j < k; ++j) y[i * k + j] = accumulate ? y[i * k + j] + row[j] : row[j];
    }
  });
}

DC_KERNEL_VARIANT_END
}  // namespace dc::cpu
