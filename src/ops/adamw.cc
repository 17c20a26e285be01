// AdamW front-end: the step's scalars, and the checks and dispatch of the fused matrix update.
#include "ops/adamw.h"

#include <cmath>

#include "core/check.h"
#include "core/profiler.h"
#include "ops/cpu/kernels.h"
#include "ops/device.h"

namespace dc {

AdamWStep adamw_scalars(int64_t t, double lr, double beta1, double beta2, double eps, double weight_decay,
                        float grad_scale) {
  AdamWStep s;
  s.decay = static_cast<float>(1.0 - lr * weight_decay);
  s.b1 = static_cast<float>(beta1), s.b2 = static_cast<float>(beta2);
  s.one_b1 = static_cast<float>(1.0 - beta1), s.one_b2 = static_cast<float>(1.0 - beta2);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, static_cast<double>(t))));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t))));
  s.eps = static_cast<float>(eps);
  s.grad_scale = grad_scale;
  return s;
}

void adamw_update(const Context& ctx, const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t n,
                  const float* clip_sumsq, float max_norm) {
  const ProfileScope profile(ctx, "adamw_update");
  DC_CHECK(p != nullptr && g != nullptr && m != nullptr && v != nullptr && n > 0, "adamw_update: bad arguments");
  switch (ctx.device) {
    case Device::kCpu: {
      AdamWStep step = s;
      if (clip_sumsq != nullptr) {  // train/optimizer.h clip_coefficient, and OptimizerCore's skip
        if (!std::isfinite(*clip_sumsq)) return;
        const double coef = max_norm / (std::sqrt(static_cast<double>(*clip_sumsq)) + 1e-6);
        step.grad_scale = max_norm <= 0 || coef >= 1.0 ? 1.0f : static_cast<float>(coef);
      }
      parallel_for(ctx.pool, n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) adamw_value(step, p[i], g[i], m[i], v[i]);
      }, 4096);
      return;
    }
    case Device::kVulkan:
      return ctx.backend->adamw_update(s, as_device(p), as_device(g), as_device(m), as_device(v), n, as_device(clip_sumsq), max_norm);
  }
}

namespace {

// Σ f(x[i]) over x [n] in double, rounded to f32: the CPU's squared_norm and sum_floats.
template <typename F>
float sum_in_double(const float* x, int64_t n, F f) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += f(static_cast<double>(x[i]));
  return static_cast<float>(sum);
}

}  // namespace

void squared_norm(const Context& ctx, const float* x, int64_t n, float* out, int64_t out_index) {
  const ProfileScope profile(ctx, "gradient norm");
  DC_CHECK(x != nullptr && out != nullptr && n > 0 && out_index >= 0, "squared_norm: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      out[out_index] = sum_in_double(x, n, [](double v) { return v * v; });
      return;
    case Device::kVulkan:
      return ctx.backend->reduce(as_device(x), n, /*squares=*/true, as_device(out), out_index);
  }
}

void sum_floats(const Context& ctx, const float* x, int64_t n, float* out) {
  const ProfileScope profile(ctx, "gradient norm");
  DC_CHECK(x != nullptr && out != nullptr && n > 0, "sum_floats: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      *out = sum_in_double(x, n, [](double v) { return v; });
      return;
    case Device::kVulkan:
      return ctx.backend->reduce(as_device(x), n, /*squares=*/false, as_device(out), 0);
  }
}

void adamw_update_panels(const Context& ctx, const AdamWStep& s, float* p, const float* g, float* m, float* v,
                         int64_t rows, int64_t cols, uint32_t* w_panels) {
  const ProfileScope profile(ctx, "adamw_update_panels");
  DC_CHECK(p != nullptr && g != nullptr && m != nullptr && v != nullptr && rows > 0 && cols > 0,
           "adamw_update_panels: bad arguments");
  DC_CHECK(reinterpret_cast<uintptr_t>(w_panels) % 64 == 0,
           "adamw_update_panels: the panels must be 64-byte aligned");
  DC_CHECK(ctx.device == Device::kCpu && cpu::cpu_has_avx512_bf16(), "adamw_update_panels: needs AVX512_BF16");
  Workspace own_workspace;  // the strip buffers: ctx's, or (without one) this call's
  Workspace& ws = ctx.workspace != nullptr ? *ctx.workspace : own_workspace;
  cpu::adamw_update_panels_fast(ctx.pool, ws, s, p, g, m, v, rows, cols, w_panels);
}

}  // namespace dc
