// The Vulkan kernels of training: the backward of the forward's ops, the fused cross-entropy over the loss
// rows, the gradient norm's reduction and AdamW, each a compute shader (shaders/) behind a front-end that
// checks the shapes against the buffers and records its dispatches into a Sequence (kernels.h's
// conventions). The CPU's ops (ops/elementwise.h, ops/matmul.h, ops/attention.h, ops/loss.h, ops/adamw.h)
// are the reference; every product and reduction is in f32 (no matrix units yet).
#pragma once

#include <cstdint>

#include "ops/vulkan/kernels.h"

namespace dc::vk {

// matmul_nt's backward, y = x·wᵀ + bias: dx[n, w.cols] (+)= dy[n, w.rows]·w over any dense or quantized w;
// dw[w.rows, w.cols] (+)= dyᵀ·x (x [n, w.cols] f32); dbias[w.rows] (+)= Σ_rows dy. Each of dx, dw, dbias may
// be nullptr (not wanted); `accumulate_dx` / `accumulate_dw` (dw and dbias): add, else overwrite.
Status matmul_nt_backward(Sequence& seq, const Buffer& x, int64_t n, const DeviceMatrix& w, const Buffer& dy, Buffer* dx,
                          Buffer* dw, Buffer* dbias, bool accumulate_dx, bool accumulate_dw);

// RMSNorm's backward (ops/elementwise.h rms_norm_backward): dx[n, d] += ..., dw[d] += ... (either may be
// nullptr); rstd [n] is scratch (each row's r, written then read).
Status rms_norm_backward(Sequence& seq, const Buffer& x, const Buffer& w, const Buffer& dy, int64_t n, int64_t d, float eps,
                         Buffer* dx, Buffer* dw, Buffer& rstd);

// (RoPE's backward is kernels.h rope_apply with `inverse`.)

// SwiGLU's backward: dgate, dup [count] overwritten (either may be dout).
Status swiglu_backward(Sequence& seq, const Buffer& gate, const Buffer& up, const Buffer& dout, int64_t count, Buffer& dgate,
                       Buffer& dup);

// The embedding's scatter-add: dtable[ids[i]] += dy[i] for ids[n] (uint32, each < the table's rows: the
// caller checks them), dy [n, cols], in the order of i.
Status embedding_backward(Sequence& seq, const Buffer& ids, int64_t n, const Buffer& dy, int64_t cols, Buffer& dtable);

// Attention's backward (ops/attention.h attention_backward; the full attention, AttentionDims as the
// forward's): dq [B, L, n_head, head_dim], dk, dv [B, L, n_head_kv, head_dim] overwritten; `stats` is
// scratch [B, L, n_head, 3] (each query row's max, sum and δ).
Status attention_backward(Sequence& seq, const AttentionDims& dims, const Buffer& q, const Buffer& k, const Buffer& v,
                          const Buffer* valid, const Buffer& out, const Buffer& dout, Buffer& dq, Buffer& dk, Buffer& dv,
                          Buffer& stats);

// The fused cross-entropy (ops/loss.h cross_entropy) of logits[n, n_vocab] against targets[n] (uint32, each
// < n_vocab: the caller checks them) with f32 weights[n]: wce [n] gets each row's weights·CE, ce [n] (nullptr:
// not wanted) its CE, dlogits (nullptr: not wanted; may be logits) weights·(softmax − onehot).
Status cross_entropy(Sequence& seq, const Buffer& logits, const Buffer& targets, const Buffer& weights, int64_t n, int64_t n_vocab,
                     Buffer* dlogits, Buffer* ce, Buffer& wce);

// out[out_index] = Σ x[offset, offset + count) (of squares with `squares`) in a fixed order, through `partials`
// (scratch of reduce_partials(count) floats): each gradient's Σ g² and their sum, the loss's Σ weights·CE.
int64_t reduce_partials(int64_t count);
Status reduce_sum(Sequence& seq, const Buffer& x, int64_t offset, int64_t count, bool squares, Buffer& partials, Buffer& out,
                  int64_t out_index = 0);

// The scalars of an AdamW step (ops/adamw.h AdamWStep, repeated here: this layer is below ops).
struct AdamWScalars {
  float decay = 1, b1 = 0.9f, b2 = 0.999f, one_b1 = 0.1f, one_b2 = 0.001f, step_size = 0, bc2_sqrt = 1, eps = 1e-8f;
  float grad_scale = 1;
};
// AdamW over p, g, m, v [n] (ops/adamw.h adamw_value per value). With `sumsq` (a buffer whose first float is
// Σ g² over every gradient): nothing is written when it is not finite (the step is skipped), else the gradients
// are first scaled by clip_grad_norm's coefficient for max_norm (1 when max_norm <= 0; grad_scale is then
// unused); without it by grad_scale.
Status adamw_update(Sequence& seq, const AdamWScalars& s, Buffer& p, const Buffer& g, Buffer& m, Buffer& v, int64_t n,
                    const Buffer* sumsq, float max_norm);

}  // namespace dc::vk
