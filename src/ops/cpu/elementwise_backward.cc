// CPU backward kernels of RMSNorm, RoPE, SwiGLU and the embedding lookup, plus an f32 transpose.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/kernel_variant.h"
#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"

namespace dc::cpu {
DC_KERNEL_VARIANT_BEGIN  // baseline:: here, avx2:: in kernels_avx2.cc

void rms_norm_backward(ThreadPool* pool, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                       float eps, float* dx, float* dw) {
  std::vector<float> rstd(n);  // [n] r of each row, as the forward computes it
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* xi = x + i * d;
      double ss = 0;
      for (int64_t t = 0; t < d; ++t) ss += static_cast<double>(xi[t]) * xi[t];
      rstd[i] = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      if (dx == nullptr) continue;
      const float* gi = dy + i * d;
      double dot = 0;  // Σ w·dy·x
      for (int64_t t = 0; t < d; ++t) dot += static_cast<double>(w[t]) * gi[t] * xi[t];
      const float r = rstd[i];
      const float c = static_cast<float>(dot) * r * r * r / static_cast<float>(d);
      float* o = dx + i * d;
      for (int64_t t = 0; t < d; ++t) o[t] += r * w[t] * gi[t] - xi[t] * c;
    }
  }, 4);
  if (dw == nullptr) return;
  parallel_for(pool, d, [&](int64_t b, int64_t e) {  // columns: each thread owns dw[b, e)
    std::vector<float> acc(e - b, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * d;
      const float* gi = dy + i * d;
      const float r = rstd[i];
      for (int64_t t = b; t < e; ++t) acc[t - b] += gi[t] * xi[t] * r;
    }
    for (int64_t t = b; t < e; ++t) dw[t] += acc[t - b];
  }, 64);
}

void rope_backward(ThreadPool* pool, float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin) {
  rope_apply(pool, dx, n, n_heads, head_dim, cos, sin, /*inverse=*/true);  // a rotation's gradient: its transpose
}

void swiglu_backward(ThreadPool* pool, const float* gate, const float* up, const float* dout, int64_t count,
                     float* dgate, float* dup) {
  parallel_for(pool, count, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i], u = up[i], d = dout[i];
      const float s = 1.0f / (1.0f + std::exp(-g));
      dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
      dup[i] = d * g * s;
    }
  }, 4096);
}

void embedding_backward(ThreadPool* pool, const int32_t* ids, int64_t n, const float* dy, int64_t cols,
                        float* dtable) {
  // Threaded over columns so that repeated ids never race; rows are added in order (deterministic).
  parallel_for(pool, cols, [&](int64_t b, int64_t e) {
    for (int64_t i = 0; i < n; ++i) {
      float* o = dtable + static_cast<int64_t>(ids[i]) * cols;
      const float* g = dy + i * cols;
      for (int64_t t = b; t < e; ++t) o[t] += g[t];
    }
  }, 64);
}

void transpose(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, float* y) {
  constexpr int64_t kBlock = 32;
  const int64_t n_rb = (rows + kBlock - 1) / kBlock;
  parallel_for(pool, n_rb, [&](int64_t b, int64_t e) {
    for (int64_t rb = b; rb < e; ++rb) {
      const int64_t r0 = rb * kBlock, r1 = std::min(rows, r0 + kBlock);
      for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
        const int64_t c1 = std::min(cols, c0 + kBlock);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) y[c * rows + r] = x[r * cols + c];
      }
    }
  }, 1);
}

DC_KERNEL_VARIANT_END
}  // namespace dc::cpu
