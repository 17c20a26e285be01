// Bidirectional multi-head attention with grouped KV heads and a padding mask (no causal mask).
#pragma once

#include <cstdint>

#include "core/context.h"

namespace dc {

struct AttentionShape {
  int64_t n_batch = 0, n_seq = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;  // query head h uses KV head h / (n_head / n_head_kv)
};

// out[B, L, n_head, head_dim] = softmax(q·kᵀ / sqrt(head_dim)) · v per head, where query i of row b
// attends key j iff valid[b, i] && valid[b, j] (valid == nullptr: every pair). A query with no key to
// attend gets a zero output. q: [B, L, n_head, head_dim]; k, v: [B, L, n_head_kv, head_dim].
// Never materialises an L×L matrix: the reference kernel keeps one score row per thread, the fast one
// (default; ctx.reference_kernels picks the reference) blocks of 64 keys × the query rows of a head group.
void attention(const Context& ctx, const AttentionShape& shape, const float* q, const float* k, const float* v,
               const uint8_t* valid, float* out);

// Attention backward (training). Inputs as the forward's, plus its output `out` and dout (both
// [B, L, n_head, head_dim]). Overwrites dq ([B, L, n_head, head_dim]), dk and dv ([B, L, n_head_kv,
// head_dim]). Per query row with P = softmax(S), S = q·kᵀ/√D over the keys it attends:
//   dP = dout·vᵀ   dS = P ⊙ (dP − rowsum(dout ⊙ out))   dq = dS·k/√D   dk += dSᵀ·q/√D   dv += Pᵀ·dout
// (summed over the query heads sharing a KV head). Rows with no valid key (padding) get zero gradients.
// Recomputes P (nothing but the forward output is saved); threaded over (batch, KV head). Under
// bf16_backward(ctx) (mixed precision, ops/matmul.h) S and P stay f32 and the four products dP, dq, dk,
// dv take bf16 operands with f32 sums: within 2e-2 of the largest gradient of the f32 result (the
// tolerance tests/ops/backward_test.cc holds it to; measured 2e-3 to 1e-2). On a device (Context::device kVulkan)
// the operands are the device's memory and everything is f32 (ops/vulkan/backward_kernels.h).
void attention_backward(const Context& ctx, const AttentionShape& shape, const float* q, const float* k,
                        const float* v, const uint8_t* valid, const float* out, const float* dout, float* dq,
                        float* dk, float* dv);

}  // namespace dc
