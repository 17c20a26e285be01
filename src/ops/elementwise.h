// Row-wise and element-wise ops of the Dream forward: RMSNorm, RoPE, SwiGLU, residual add, embedding.
// All activations are f32 row-major; each op overwrites its output unless it says "in place".
#pragma once

#include <cstdint>

#include "core/context.h"
#include "ops/weight.h"

namespace dc {

// y[n, d] = x[n, d] * rsqrt(mean(x²) + eps) * w[d]. y may alias x.
void rms_norm(const Context& ctx, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y);

// RoPE tables for rotate-half RoPE: cos/sin[n, head_dim/2] for angles pos · inv_freq[i],
// inv_freq[i] = 1 / theta^(2i / head_dim), computed in f32 as the reference does.
void rope_tables(const int32_t* positions, int64_t n, int64_t head_dim, double theta, float* cos, float* sin);

// In place on x[n, n_heads, head_dim]: x' = x·cos + rotate_half(x)·sin, rotate_half(x) = [-x₂, x₁]
// where x₁ = x[:head_dim/2], x₂ = x[head_dim/2:]; cos/sin from rope_tables for the same n rows.
void rope_apply(const Context& ctx, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                const float* sin);

// out[n, f] = silu(gate[n, f]) * up[n, f]. out may alias gate or up.
void swiglu(const Context& ctx, const float* gate, const float* up, int64_t count, float* out);

// y[count] += x[count].
void add_inplace(const Context& ctx, float* y, const float* x, int64_t count);

// y[count] = s · x[count] (y may be x): a LoRA adapter's scale (model/lora_project.h).
void scale_floats(const Context& ctx, const float* x, int64_t count, float s, float* y);

// y[count] = 0 where ctx's ops write (on the CPU with streaming stores, so y's lines are not read first:
// for large buffers written now and read much later, a gradient the backward scatters into).
void zero_fill(const Context& ctx, float* y, int64_t count);

// y[count] = x[count], bit for bit (the training forward's saved activations); y must not overlap x. On a device
// x and y may start at an offset into their buffers (a chunk of rows: x + r·cols), not in the same buffer.
void copy_floats(const Context& ctx, const float* x, int64_t count, float* y);

// out[n, table.cols] = table[ids[i]] as f32. Precondition: 0 <= ids[i] < table.rows.
void embedding(const Context& ctx, const WeightView& table, const int32_t* ids, int64_t n, float* out);

// out[n, cols] = x[rows[r], :] for each r: the rows of x (f32 [*, cols]) the caller names, e.g. the
// forward's out rows before the final norm. Overwrites out (which must not overlap x).
void gather_rows(const Context& ctx, const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out);

// ---- Backward passes (training). Each adds into gradient buffers the caller zeroed unless it says
// "overwrites"; inputs are the forward's inputs (saved activations). On a device (Context::device kVulkan) every operand
// but the norm weight w (the host view its upload is keyed by, as in the forward) is the device's memory.

// RMSNorm backward. With r = rsqrt(mean(x²) + eps), y = x·r·w:
//   dx_i += r·w_i·dy_i − x_i · r³/d · Σ_t w_t·dy_t·x_t        dw_i += Σ_rows dy_i·x_i·r
// x, dy, dx: [n, d]; w, dw: [d]. dx may be nullptr (not needed), dw too.
void rms_norm_backward(const Context& ctx, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                       float eps, float* dx, float* dw);

// RoPE backward, in place on dx[n, n_heads, head_dim] (overwrites: dy in, dx out). The forward is a
// rotation by the angle θ in each (x₁, x₂) pair, so the backward rotates by −θ:
//   dx₁ = dy₁·cos + dy₂·sin        dx₂ = dy₂·cos − dy₁·sin
void rope_backward(const Context& ctx, float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin);

// SwiGLU backward (overwrites dgate and dup; either may alias dout). With s = sigmoid(g):
//   dgate = dout·up·s·(1 + g·(1 − s))        dup = dout·g·s
void swiglu_backward(const Context& ctx, const float* gate, const float* up, const float* dout, int64_t count,
                     float* dgate, float* dup);

// Embedding backward: dtable[ids[i]] += dy[i] for each of the n rows. dy: [n, cols]; dtable: [rows, cols].
void embedding_backward(const Context& ctx, const int32_t* ids, int64_t n, const float* dy, int64_t cols,
                        float* dtable);

}  // namespace dc
