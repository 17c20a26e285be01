// attention_window and kv_store front-ends: check the head layout and the window, then dispatch on the device.
#include "ops/attention_window.h"

#include <algorithm>

#include "core/check.h"
#include "core/profiler.h"
#include "ops/cpu/kernels.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace dc {
namespace {

// A scattered window (positions) lies inside [window_begin, n_seq), ascending; the device kernels take
// contiguous windows only (Model::check_forward refuses a scattered one there first).
void check_positions(const int64_t* positions, int64_t window_begin, int64_t window_len, int64_t n_seq, Device device,
                     const char* op) {
  if (positions == nullptr) return;
  DC_CHECK(device == Device::kCpu, op);  // scattered window positions run on the CPU only
  for (int64_t i = 0; i < window_len; ++i)  // they ascend inside [window_begin, n_seq)
    DC_CHECK(positions[i] >= window_begin && positions[i] < n_seq && (i == 0 || positions[i] > positions[i - 1]), op);
}

}  // namespace

void attention_window(const Context& ctx, const AttentionShape& shape, int64_t window_begin, int64_t window_len,
                      const float* q, const float* k, const float* v, const uint8_t* valid, float* out,
                      const int64_t* positions) {
  DC_CHECK(q && k && v && out, "attention_window: null operand");
  DC_CHECK(shape.n_head > 0 && shape.n_head_kv > 0 && shape.n_head % shape.n_head_kv == 0,
           "attention_window: n_head must be a multiple of n_head_kv");
  DC_CHECK(shape.head_dim > 0 && shape.n_batch >= 0 && shape.n_seq >= 0, "attention_window: bad sizes");
  DC_CHECK(window_begin >= 0 && window_len >= 0 && window_begin + window_len <= shape.n_seq,
           "attention_window: the window must lie inside [0, n_seq)");
  check_positions(positions, window_begin, window_len, shape.n_seq, ctx.device, "attention_window");
  Workspace own_workspace;  // the kernel's block buffers: ctx's, or (without one) this call's
  Workspace& ws = ctx.workspace != nullptr ? *ctx.workspace : own_workspace;
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels)
        return cpu::attention_window(ctx.pool, shape, window_begin, window_len, q, k, v, valid, out, positions);
      return cpu::attention_window_fast(ctx.pool, ws, shape, window_begin, window_len, q, k, v, valid, out, positions);
    case Device::kVulkan:
      return ctx.backend->attention(shape, window_begin, window_len, as_device(q), as_device(k), as_device(v),
                                     as_device(valid), as_device(out));
  }
}

void kv_store(const Context& ctx, const float* src, int64_t n_batch, int64_t n_seq, int64_t window_begin,
              int64_t window_len, int64_t cols, float* cache, const int64_t* positions) {
  DC_CHECK(src && cache && n_batch >= 0 && cols > 0, "kv_store: bad arguments");
  DC_CHECK(window_begin >= 0 && window_len >= 0 && window_begin + window_len <= n_seq,
           "kv_store: the window must lie inside [0, n_seq)");
  check_positions(positions, window_begin, window_len, n_seq, ctx.device, "kv_store");
  switch (ctx.device) {
    case Device::kCpu:
      for (int64_t r = 0; r < n_batch; ++r) {
        if (positions == nullptr) {
          std::copy_n(src + r * window_len * cols, window_len * cols, cache + (r * n_seq + window_begin) * cols);
          continue;
        }
        for (int64_t i = 0; i < window_len; ++i)
          std::copy_n(src + (r * window_len + i) * cols, cols, cache + (r * n_seq + positions[i]) * cols);
      }
      return;
    case Device::kVulkan:
      return ctx.backend->kv_store(as_device(src), n_batch, n_seq, window_begin, window_len, cols, as_device(cache));
  }
}

void rope_kv(const Context& ctx, const AttentionShape& shape, int64_t window_begin, int64_t window_len, float* q, float* k,
             const float* v, const float* cos, const float* sin, float* cache_k, float* cache_v,
             const int64_t* positions) {
  const int64_t n = shape.n_batch * window_len, kv_cols = shape.n_head_kv * shape.head_dim;
  DC_CHECK(q && k && cos && sin && (cache_k == nullptr || (v && cache_v)), "rope_kv: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      rope_apply(ctx, q, n, shape.n_head, shape.head_dim, cos, sin);
      rope_apply(ctx, k, n, shape.n_head_kv, shape.head_dim, cos, sin);
      if (cache_k == nullptr) return;
      kv_store(ctx, k, shape.n_batch, shape.n_seq, window_begin, window_len, kv_cols, cache_k, positions);
      return kv_store(ctx, v, shape.n_batch, shape.n_seq, window_begin, window_len, kv_cols, cache_v, positions);
    case Device::kVulkan: {
      check_positions(positions, window_begin, window_len, shape.n_seq, ctx.device, "rope_kv");
      const ProfileScope profile(ctx, "RoPE + KV cache store");
      DC_CHECK(window_begin >= 0 && window_len > 0 && window_begin + window_len <= shape.n_seq, "rope_kv: the window must lie inside [0, n_seq)");
      return ctx.backend->rope_kv(shape, window_begin, window_len, as_device(q), as_device(k), as_device(v), as_device(cos),
                                  as_device(sin), as_device(cache_k), as_device(cache_v));
    }
  }
}

}  // namespace dc
