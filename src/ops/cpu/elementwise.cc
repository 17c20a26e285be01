// CPU kernels for RMSNorm, RoPE, SwiGLU, residual add, scale and embedding lookup (threaded over rows).
#include <algorithm>
#include <cmath>

#include "core/kernel_variant.h"
#include "ops/cpu/kernels.h"

namespace dc::cpu {
DC_KERNEL_VARIANT_BEGIN  // baseline:: here, avx2:: in kernels_avx2.cc

void rms_norm(ThreadPool* pool, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) {
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* xi = x + i * d;
      float* yi = y + i * d;
      double ss = 0;  // double: the mean of squares is the one reduction where f32 drift is visible
      for (int64_t t = 0; t < d; ++t) ss += static_cast<double>(xi[t]) * xi[t];
      const float r = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      for (int64_t t = 0; t < d; ++t) yi[t] = xi[t] * r * w[t];
    }
  }, 4);
}

void rope_apply(ThreadPool* pool, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                const float* sin, bool inverse) {
  const int64_t half = head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* c = cos + i * half;
      const float* s = sin + i * half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (i * n_heads + h) * head_dim;
        for (int64_t t = 0; t < half; ++t) {
          const float x1 = v[t], x2 = v[t + half], st = sign * s[t];
          v[t] = x1 * c[t] - x2 * st;
          v[t + half] = x2 * c[t] + x1 * st;
        }
      }
    }
  }, 8);
}

void swiglu(ThreadPool* pool, const float* gate, const float* up, int64_t count, float* out) {
  parallel_for(pool, count, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }, 4096);
}

void add_inplace(ThreadPool* pool, float* y, const float* x, int64_t count) {
  parallel_for(pool, count, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += x[i];
  }, 4096);
}

void scale(ThreadPool* pool, const float* x, int64_t count, float s, float* y) {
  parallel_for(pool, count, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = s * x[i];
  }, 4096);
}

void zero_fill(ThreadPool* pool, float* y, int64_t count) {
  parallel_for(pool, count, [&](int64_t b, int64_t e) { std::fill(y + b, y + e, 0.0f); }, 1 << 16);
}

void embedding(ThreadPool* pool, const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  parallel_for(pool, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) table.row_to_f32(ids[i], out + i * table.cols);
  }, 16);
}

DC_KERNEL_VARIANT_END
}  // namespace dc::cpu
