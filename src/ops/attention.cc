// attention front-end: checks the head layout, then dispatches on the context's device.
#include "ops/attention.h"

#include "core/check.h"
#include "core/profiler.h"
#include "ops/cpu/kernels.h"
#include "ops/device.h"

namespace dc {

void attention(const Context& ctx, const AttentionShape& shape, const float* q, const float* k, const float* v,
               const uint8_t* valid, float* out) {
  const ProfileScope profile(ctx, "attention");
  DC_CHECK(q && k && v && out, "attention: null operand");
  DC_CHECK(shape.n_head > 0 && shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0,
           "attention: n_head must be a multiple of n_head_kv");
  DC_CHECK(shape.head_dim > 0 && shape.n_batch >= 0 && shape.n_seq >= 0, "attention: bad sizes");
  Workspace own_workspace;  // the kernel's block buffers: ctx's, or (without one) this call's
  Workspace& ws = ctx.workspace != nullptr ? *ctx.workspace : own_workspace;
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::attention(ctx.pool, shape, q, k, v, valid, out);
      return cpu::attention_fast(ctx.pool, ws, shape, q, k, v, valid, out);
    case Device::kVulkan:
      return ctx.backend->attention(shape, 0, shape.n_seq, as_device(q), as_device(k), as_device(v), as_device(valid),
                                     as_device(out));
  }
}

}  // namespace dc
