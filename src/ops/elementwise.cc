// Front-ends of the element-wise ops: check arguments, then dispatch on the context's device (and to the
// reference kernels when the context asks for them).
#include "ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/profiler.h"
#include "ops/cpu/kernels.h"
#include "ops/device.h"

namespace dc {

void rms_norm(const Context& ctx, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) {
  const ProfileScope profile(ctx, "rms_norm");
  DC_CHECK(x && w && y && n >= 0 && d > 0 && eps > 0, "rms_norm: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::rms_norm(ctx.pool, x, w, n, d, eps, y);
      return cpu::rms_norm_fast(ctx.pool, x, w, n, d, eps, y);
    case Device::kVulkan:
      return ctx.backend->rms_norm(as_device(x), w, n, d, eps, as_device(y));
  }
}

void rope_tables(const int32_t* positions, int64_t n, int64_t head_dim, double theta, float* cos, float* sin) {
  DC_CHECK(positions && cos && sin && head_dim % 2 == 0, "rope_tables: bad arguments");
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  for (int64_t r = 0; r < n; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos[r * half + i] = std::cos(angle);
      sin[r * half + i] = std::sin(angle);
    }
  }
}

void rope_apply(const Context& ctx, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                const float* sin) {
  const ProfileScope profile(ctx, "rope");
  DC_CHECK(x && cos && sin && head_dim % 2 == 0 && n_heads > 0, "rope_apply: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::rope_apply(ctx.pool, x, n, n_heads, head_dim, cos, sin);
      return cpu::rope_apply_fast(ctx.pool, x, n, n_heads, head_dim, cos, sin);
    case Device::kVulkan:
      return ctx.backend->rope_apply(as_device(x), n, n_heads, head_dim, as_device(cos), as_device(sin));
  }
}

void swiglu(const Context& ctx, const float* gate, const float* up, int64_t count, float* out) {
  const ProfileScope profile(ctx, "swiglu");
  DC_CHECK(gate && up && out && count >= 0, "swiglu: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::swiglu(ctx.pool, gate, up, count, out);
      return cpu::swiglu_fast(ctx.pool, gate, up, count, out);
    case Device::kVulkan:
      return ctx.backend->swiglu(as_device(gate), as_device(up), count, as_device(out));
  }
}

void add_inplace(const Context& ctx, float* y, const float* x, int64_t count) {
  const ProfileScope profile(ctx, "residual add");
  DC_CHECK(y && x && count >= 0, "add_inplace: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::add_inplace(ctx.pool, y, x, count);
      return cpu::add_inplace_fast(ctx.pool, y, x, count);
    case Device::kVulkan:
      return ctx.backend->add_inplace(as_device(y), as_device(x), count);
  }
}

void scale_floats(const Context& ctx, const float* x, int64_t count, float s, float* y) {
  DC_CHECK(y && x && count >= 0, "scale_floats: bad arguments");
  if (count == 0) return;
  switch (ctx.device) {
    case Device::kCpu:
      return cpu::scale(ctx.pool, x, count, s, y);
    case Device::kVulkan:
      return ctx.backend->scale(as_device(x), count, s, as_device(y));
  }
}

void zero_fill(const Context& ctx, float* y, int64_t count) {
  DC_CHECK(y && count >= 0, "zero_fill: bad arguments");
  if (count == 0) return;
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::zero_fill(ctx.pool, y, count);
      return cpu::zero_fill_fast(ctx.pool, y, count);
    case Device::kVulkan:
      return ctx.backend->zero_fill(as_device(y), count);
  }
}

void copy_floats(const Context& ctx, const float* x, int64_t count, float* y) {
  DC_CHECK(x && y && count >= 0, "copy_floats: bad arguments");
  if (count == 0) return;
  switch (ctx.device) {
    case Device::kCpu:
      std::copy_n(x, count, y);
      return;
    case Device::kVulkan:
      return ctx.backend->copy(as_device(x), count, as_device(y));
  }
}

void embedding(const Context& ctx, const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  const ProfileScope profile(ctx, "embedding");
  DC_CHECK(!table.empty() && ids && out, "embedding: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      for (int64_t i = 0; i < n; ++i) DC_CHECK(ids[i] >= 0 && ids[i] < table.rows, "embedding: id out of range");
      return cpu::embedding(ctx.pool, table, ids, n, out);
    case Device::kVulkan:  // device ids: Model::forward checked the tokens on the host
      return ctx.backend->embedding(table, as_device(ids), n, as_device(out));
  }
}

void gather_rows(const Context& ctx, const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out) {
  DC_CHECK(x && rows && out && cols > 0 && n >= 0, "gather_rows: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      for (int64_t r = 0; r < n; ++r) std::copy_n(x + rows[r] * cols, cols, out + r * cols);
      return;
    case Device::kVulkan:
      return ctx.backend->gather_rows(as_device(x), cols, as_device(rows), n, as_device(out));
  }
}

}  // namespace dc
