// AdamW's update of one value (torch.optim.AdamW, single-tensor path), written once here, and the
// fused form mixed-precision training runs over each matrix: the update that also writes the bf16
// copy the next step's GEMMs read (W in the kPanels layout of ops/weight.h; the backward reads it as Wᵀ) while the updated
// weights are still in registers, instead of a second pass over the f32 master weights.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/context.h"

namespace dc {

// The scalars of one step, as PyTorch computes them (in double, then f32).
struct AdamWStep {
  float decay = 1;       // 1 − lr·weight_decay
  float b1 = 0.9f, b2 = 0.999f, one_b1 = 0.1f, one_b2 = 0.001f;
  float step_size = 0;   // lr / (1 − β1^t)
  float bc2_sqrt = 1;    // √(1 − β2^t)
  float eps = 1e-8f;
  float grad_scale = 1;  // every gradient is multiplied by this first (clip_grad_norm's coefficient)
};
// Step t (1-based) at rate lr.
AdamWStep adamw_scalars(int64_t t, double lr, double beta1, double beta2, double eps, double weight_decay,
                        float grad_scale = 1);

// One value, the f32 arithmetic of torch.optim.AdamW in its order (after clip_grad_norm's g ← g·c):
//   g ← g·grad_scale;  p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//   p ← p − lr/(1−β1^t) · m / (√v / √(1−β2^t) + eps)
// Every AdamW kernel calls this, so they agree bit for bit.
inline void adamw_value(const AdamWStep& s, float& p, float g, float& m, float& v) {
  g *= s.grad_scale;
  p *= s.decay;
  m = m * s.b1 + g * s.one_b1;
  v = v * s.b2 + s.one_b2 * g * g;
  const float denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
  p += -s.step_size * (m / denom);
}

// AdamW over flat f32 buffers p, g, m, v [n] in ctx's memory (a device's on a device), adamw_value per value.
// With clip_sumsq (ctx's memory, [1]: Σ g² over every gradient) the step is decided where the values are, so that
// the norm need not cross to the host before the update: nothing is written when Σ is not finite (OptimizerCore's
// skip), else the gradients are first scaled by clip_grad_norm's coefficient max_norm / (√Σ + 1e-6) when
// max_norm > 0 and it is below 1 (train/optimizer.h clip_coefficient; it replaces s.grad_scale). A device's
// division and square root are not correctly rounded: its values are adamw_value's within 1e-6 relative, not bit
// for bit.
void adamw_update(const Context& ctx, const AdamWStep& s, float* p, const float* g, float* m, float* v, int64_t n,
                  const float* clip_sumsq = nullptr, float max_norm = 0);
// out[out_index] = Σ x² over x [n] in ctx's memory: one gradient's part of the global norm's square. The CPU
// sums in double (then rounds), a device in f32 in a fixed order.
void squared_norm(const Context& ctx, const float* x, int64_t n, float* out, int64_t out_index = 0);
// out[0] = Σ x over x [n] in ctx's memory (the per-tensor Σ g² into the global one), as squared_norm sums.
void sum_floats(const Context& ctx, const float* x, int64_t n, float* out);

// AdamW over the matrix p [rows, cols] (gradient g, moments m and v of the same shape), threaded on
// ctx.pool, fused with mixed precision's re-layout: the updated p rounded to bf16 (round to nearest
// even) is written as W into `w_panels` (kPanels of p [rows, cols], the whole copy: panel_sizes(...).data_bytes,
// ops/matmul.h; 64-byte aligned; may be nullptr), the one copy the forward and the backward read. p, m and v are those of adamw_value bit for bit, and the panels those
// pack_panels writes for the rounded p. Needs AVX512_BF16 (bf16_backward(ctx), ops/matmul.h).
void adamw_update_panels(const Context& ctx, const AdamWStep& s, float* p, const float* g, float* m, float* v,
                         int64_t rows, int64_t cols, uint32_t* w_panels);

}  // namespace dc
