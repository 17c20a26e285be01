// Model::backward: the Dream forward of transformer.cc run in reverse over the saved Activations
// (llm.c style). dh is the gradient of the residual stream; each block's backward adds into it.
#include <algorithm>
#include <new>
#include <span>
#include <vector>

#include "core/profiler.h"
#include "model/lora_project.h"
#include "model/transformer.h"
#include "ops/attention.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace dc {

Status Model::backward(const Context& ctx, Activations& acts, BackwardFrom from, const ModelSpans& grads,
                       const ModelWeights* transposed, GradWrite write) const {
  const ProfileScope profile(ctx, "backward");
  if (ctx.device != Device::kCpu) {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    DC_RETURN_IF_ERROR(record_backward(ctx, acts, from, grads, write));
    return ctx.backend->finish();
  }
  Workspace own_workspace;  // without ctx.workspace, this call's scratch (freed on return)
  Context with_ws = ctx;
  if (with_ws.workspace == nullptr) with_ws.workspace = &own_workspace;
  try {
    return backward_body(with_ws, acts, from, &grads, nullptr, nullptr, transposed, write);
  } catch (const std::bad_alloc&) {  // the workspace or the kernels' scratch (rethrown by the pool)
    return resource_exhausted("backward: out of memory for the gradients' workspace of " +
                              std::to_string(acts.n_batch) + " rows × " + std::to_string(acts.n_seq) +
                              " positions; use fewer rows, a shorter sequence or gradient checkpointing");
  }
}

Status Model::record_backward(const Context& ctx, Activations& acts, BackwardFrom from, const ModelSpans& grads,
                              GradWrite write) const {
  DC_CHECK(ctx.device != Device::kCpu, "Model::record_backward: a device context");
  if (grads.on_layer_done || grads.on_head_done)
    return invalid_argument("backward: the per-layer gradient hooks (ZeRO-2 over ranks) run on the CPU only; a device's "
                            "backward writes the whole gradients (one device per process for now)");
  return backward_body(ctx, acts, from, &grads, nullptr, nullptr, nullptr, write);
}

Status Model::record_backward_lora(const Context& ctx, Activations& acts, BackwardFrom from, const LoraWeights& lora,
                                   const LoraGrads& grads) const {
  DC_CHECK(ctx.device != Device::kCpu, "Model::record_backward_lora: a device context");
  if (lora.layers.size() != weights_.layers.size() || grads.layers.size() != weights_.layers.size())
    return invalid_argument("backward_lora: the adapters or their gradients are not shaped like this model's layers");
  return backward_body(ctx, acts, from, nullptr, &lora, &grads, nullptr, GradWrite::kAdd);  // the adapters uploaded
}

namespace {

// kOverwrite: zeroes the gradients no product overwrites: the norm weights' (their backward adds, row by
// row) and an untied embedding table's (a scatter of the token rows; tied, the lm_head's dW writes it first).
void zero_added_grads(const Context& ctx, const ModelConfig& c, const ModelSpans& grads) {
  const ProfileScope profile(ctx, "zero the added gradients");
  auto zero = [&](std::span<float> g) { zero_fill(ctx, g.data(), static_cast<int64_t>(g.size())); };
  for (const LayerSpans& g : grads.layers) zero(g.attn_norm), zero(g.ffn_norm);
  zero(grads.output_norm);
  if (c.tie_word_embeddings) return;
  zero_fill(ctx, grads.tok_embd.data(), static_cast<int64_t>(grads.tok_embd.size()));
}

// The backward's buffers: in ctx.workspace on the CPU (the trainer's: kept between steps, no allocation and
// no page faults per step), the device's named buffers on a device. Each is written before it is read (the
// first product into it overwrites it); backward_body zeroes dh and dfinal.
struct BackwardBuffers {
  float* dh;      // [T, E] ∂loss/∂(residual stream)
  float* dnorm;   // [n_out, E] ∂loss/∂final_norm (none when backward starts after the lm_head)
  float* dfinal;  // [n_out, E] ∂loss/∂final_x
  float* dbig1;   // [T, F]
  float* dbig2;   // [T, F]
  float* da;      // [T, E]
  float* dq;      // [T, H*D]
  float* dattn;   // [T, H*D]
  float* dk;      // [T, Hkv*D]
  float* dv;      // [T, Hkv*D]
  float* h_re;    // [T, E] with recompute (else none)
  float* tmp_re;  // [T, E] with recompute
};

BackwardBuffers backward_buffers(const Context& ctx, int64_t T, int64_t n_out, int64_t E, int64_t F, int64_t q_dim,
                                 int64_t kv_dim, bool recompute, bool from_hidden) {
  auto get = [&](const char* name, int64_t n) { return device_floats(ctx, name, n); };
  return {get("backward.dh", T * E),       get("backward.dnorm", from_hidden ? 0 : n_out * E),
          get("backward.dfinal", n_out * E),
          get("backward.dbig1", T * F),    get("backward.dbig2", T * F),     get("backward.da", T * E),
          get("backward.dq", T * q_dim),   get("backward.dattn", T * q_dim), get("backward.dk", T * kv_dim),
          get("backward.dv", T * kv_dim),  get("backward.h_re", recompute ? T * E : 0),
          get("backward.tmp_re", recompute ? T * E : 0)};
}

}  // namespace

int64_t Model::backward_bytes(int64_t T, int64_t n_out, bool recompute, bool from_hidden) const {
  const ModelConfig& c = config_;
  const int64_t E = c.n_embd, F = c.n_ff, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  // backward_buffers' sizes, then the attention's statistics [T, n_head, 3] and RMSNorm's r [T], then the inputs:
  // tokens, valid (a byte, counted as a word), cos and sin [T, D/2], out rows.
  const int64_t buffers = T * (2 * E + 2 * F + 2 * q_dim + 2 * kv_dim) + (from_hidden ? 1 : 2) * n_out * E +
                          (recompute ? 2 * T * E : 0);
  const int64_t scratch = T * c.n_head * 3 + T, inputs = T * (2 + c.head_dim) + n_out;
  return (buffers + scratch + inputs) * static_cast<int64_t>(sizeof(float));
}

Status Model::backward_lora(const Context& ctx, Activations& acts, BackwardFrom from, const LoraWeights& lora,
                            const LoraGrads& grads, const ModelWeights* transposed) const {
  const ProfileScope profile(ctx, "backward");
  if (ctx.device != Device::kCpu) {  // grads: device operands (DeviceLora); the adapters uploaded by the forward
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    DC_RETURN_IF_ERROR(record_backward_lora(ctx, acts, from, lora, grads));
    return ctx.backend->finish();
  }
  if (lora.layers.size() != weights_.layers.size() || grads.layers.size() != weights_.layers.size())
    return invalid_argument("backward_lora: the adapters or their gradients are not shaped like this model's layers");
  Workspace own_workspace;
  Context with_ws = ctx;
  if (with_ws.workspace == nullptr) with_ws.workspace = &own_workspace;
  try {
    return backward_body(with_ws, acts, from, nullptr, &lora, &grads, transposed, GradWrite::kAdd);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("backward: out of memory for the gradients' workspace of " +
                              std::to_string(acts.n_batch) + " rows × " + std::to_string(acts.n_seq) +
                              " positions; use fewer rows, a shorter sequence or gradient checkpointing");
  }
}

void Model::lm_head_backward(const Context& ctx, const float* hidden, int64_t n, const float* dlogits, float* dhidden,
                             float* dw, GradWrite write, const WeightView* wt) const {
  matmul_nt_backward(ctx, hidden, n, weights_.output, dlogits, dhidden, dw, nullptr, wt, write, GradWrite::kOverwrite);
}

Status Model::backward_body(const Context& ctx, Activations& acts, BackwardFrom from, const ModelSpans* grads_in,
                            const LoraWeights* lora, const LoraGrads* lora_grads, const ModelWeights* transposed,
                            GradWrite write) const {
  // grads_in null: the base is frozen (LoRA): no weight gradients, only dx through it and the adapters'.
  const ModelSpans no_grads;
  const ModelSpans& grads = grads_in != nullptr ? *grads_in : no_grads;
  const bool base = grads_in != nullptr;
  auto at = [&](std::span<float> g) { return base ? g.data() : nullptr; };
  const ModelConfig& c = config_;
  const int64_t B = acts.n_batch, L = acts.n_seq, T = B * L, E = c.n_embd, D = c.head_dim, F = c.n_ff;
  const int64_t q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  const int64_t n_out = static_cast<int64_t>(acts.out_rows.size());
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (T == 0 || static_cast<int64_t>(acts.layers.size()) != c.n_layer)
    return invalid_argument("backward: the activations do not come from a training-mode forward of this model");
  if (base && (grads.layers.size() != weights_.layers.size() ||
      static_cast<int64_t>(grads.tok_embd.size()) != weights_.tok_embd.rows * weights_.tok_embd.cols ||
      static_cast<int64_t>(grads.output.size()) != weights_.output.rows * weights_.output.cols))
    return invalid_argument("backward: grads must be f32 buffers shaped like the weights (ModelParams::spans())");
  bool quantized = false;
  if (base)
    visit_tensors(config_, weights_, [&](const std::string&, const std::vector<int64_t>&, const WeightView* m,
                                         const VectorView*) { quantized = quantized || (m != nullptr && m->quantized()); });
  if (quantized) return invalid_argument("backward: quantized weights cannot be trained (train LoRA adapters over them)");
  DC_CHECK(n_out == 0 || (from.dlogits != nullptr) != (from.dhidden != nullptr),
           "Model::backward: start from dlogits or from dhidden, one of them");
  if (acts.device() != ctx.device)
    return invalid_argument("backward: the activations were saved on another device than this backward's");
  // The forward's inputs where the ops read them (uploaded on a device).
  const uint8_t* valid = device_copy(ctx, "backward.valid", acts.valid.empty() ? nullptr : acts.valid.data(), T);
  const int32_t* tokens = device_copy(ctx, "backward.tokens", acts.tokens.data(), T);
  const float* cos = device_copy(ctx, "backward.cos", acts.cos.data(), T * D / 2);
  const float* sin = device_copy(ctx, "backward.sin", acts.sin.data(), T * D / 2);
  std::vector<int32_t> out_rows(acts.out_rows.begin(), acts.out_rows.end());  // [n_out] (each < T)
  const int32_t* out_rows_at = device_copy(ctx, "backward.out_rows", out_rows.data(), n_out);

  const auto [dh, dnorm, dfinal, dbig1, dbig2, da, dq, dattn, dk, dv, h_re, tmp_re] =
      backward_buffers(ctx, T, n_out, E, F, q_dim, kv_dim, acts.recompute, from.dhidden != nullptr);
  DC_RETURN_IF_ERROR(device_status(ctx));
  if (base && write == GradWrite::kOverwrite) zero_added_grads(ctx, c, grads);
  zero_fill(ctx, dh, T * E);
  if (n_out > 0) {  // lm_head (unless the caller ran its backward) and the final norm, on the n_out rows only
    zero_fill(ctx, dfinal, n_out * E);
    if (from.dlogits != nullptr)
      lm_head_backward(ctx, acts.final_norm, n_out, from.dlogits, dnorm, at(grads.output), write,
                       transposed != nullptr && !transposed->output.empty() ? &transposed->output : nullptr);
    const float* dhead = from.dlogits != nullptr ? dnorm : from.dhidden;  // [n_out, E] ∂loss/∂final_norm
    rms_norm_backward(ctx, acts.final_x, weights_.output_norm.data(), dhead, n_out, E, eps, dfinal, at(grads.output_norm));
    // dh[out_rows[r]] += dfinal[r], rows in order (they may repeat): the embedding's scatter-add.
    embedding_backward(ctx, out_rows_at, n_out, dfinal, E, dh);
  } else if (base && write == GradWrite::kOverwrite && from.dhidden == nullptr) {  // no rows: a zero lm_head gradient
    zero_fill(ctx, grads.output.data(), static_cast<int64_t>(grads.output.size()));
  }
  if (grads.on_head_done) DC_RETURN_IF_ERROR(grads.on_head_done());
  const AttentionShape shape{B, L, c.n_head, c.n_head_kv, D};
  ForwardBatch whole;  // what the training forward ran on: every position, no cache
  whole.n_batch = B, whole.n_seq = L, whole.valid = valid, whole.lora = lora;
  for (int64_t il = c.n_layer - 1; il >= 0; --il) {
    const LayerWeights& l = weights_.layers[il];
    const LayerSpans g = base ? grads.layers[il] : LayerSpans{};
    // Mixed precision: the bf16 wᵀ of each matrix, laid out once per optimizer step.
    // (An empty view: none for that matrix, e.g. a LoRA base's quantized one; wᵀ is then made per call.)
    auto wt = [&](WeightView LayerWeights::*m) {
      return transposed != nullptr && !(transposed->layers[il].*m).empty() ? &(transposed->layers[il].*m) : nullptr;
    };
    if (acts.recompute) {  // gradient checkpointing: run the layer again from its saved input
      LayerActivations& s = acts.scratch;
      copy_floats(ctx, acts.layers[il].x, T * E, s.x);
      copy_floats(ctx, s.x, T * E, h_re);
      LayerPass pass{{&whole, 1}, T, cos, sin, h_re, tmp_re, nullptr};
      pass.a1 = s.a1, pass.q = s.q, pass.k = s.k, pass.v = s.v;
      pass.attn = s.attn, pass.h_mid = s.h_mid, pass.a2 = s.a2;
      pass.gate = s.gate, pass.up = s.up, pass.act = s.act, pass.lora_u = &s.lora_u;
      layer_forward(ctx, il, pass);
    }
    const LayerActivations& a = acts.recompute ? acts.scratch : acts.layers[il];
    // MLP: h_out = h_mid + act·W_downᵀ, act = silu(gate)·up, gate/up = a2·W_{gate,up}ᵀ, a2 = norm(h_mid)
    constexpr GradWrite kFirst = GradWrite::kOverwrite;  // the first product into dbig1 / da / dattn writes it
    // Each projection's backward with its LoRA adapter's, if any (x: the projection's saved input).
    auto proj = [&](const float* x, const WeightView& w, WeightView LayerWeights::*m, const float* dy,
                    float* dx, std::span<float> dw, std::span<float> dbias, GradWrite dx_write, int t) {
      const LoraGradMatrix* lg = lora_grads != nullptr ? &lora_grads->layers[il][t] : nullptr;
      lora_project_backward(ctx, x, T, w, dy, dx, at(dw), base && !dbias.empty() ? dbias.data() : nullptr, wt(m),
                            write, dx_write, LoraSite{lora, il, t}, a.lora_u[t], lg);
    };
    // MLP: h_out = h_mid + act·W_downᵀ, act = silu(gate)·up, gate/up = a2·W_{gate,up}ᵀ, a2 = norm(h_mid)
    proj(a.act, l.w_down, &LayerWeights::w_down, dh, dbig1, g.w_down, {}, kFirst, kLoraDown);
    swiglu_backward(ctx, a.gate, a.up, dbig1, T * F, dbig1, dbig2);
    proj(a.a2, l.w_gate, &LayerWeights::w_gate, dbig1, da, g.w_gate, {}, kFirst, kLoraGate);
    proj(a.a2, l.w_up, &LayerWeights::w_up, dbig2, da, g.w_up, {}, GradWrite::kAdd, kLoraUp);
    rms_norm_backward(ctx, a.h_mid, l.ffn_norm.data(), da, T, E, eps, dh, at(g.ffn_norm));
    // Attention: h_mid = x + attn·W_oᵀ
    proj(a.attn, l.wo, &LayerWeights::wo, dh, dattn, g.wo, {}, kFirst, kLoraO);
    attention_backward(ctx, shape, a.q, a.k, a.v, valid, a.attn, dattn, dq, dk, dv);
    rope_backward(ctx, dq, T, c.n_head, D, cos, sin);
    rope_backward(ctx, dk, T, c.n_head_kv, D, cos, sin);
    proj(a.a1, l.wq, &LayerWeights::wq, dq, da, g.wq, g.bq, kFirst, kLoraQ);
    proj(a.a1, l.wk, &LayerWeights::wk, dk, da, g.wk, g.bk, GradWrite::kAdd, kLoraK);
    proj(a.a1, l.wv, &LayerWeights::wv, dv, da, g.wv, g.bv, GradWrite::kAdd, kLoraV);
    rms_norm_backward(ctx, a.x, l.attn_norm.data(), da, T, E, eps, dh, at(g.attn_norm));
    if (grads.on_layer_done) DC_RETURN_IF_ERROR(grads.on_layer_done(il));
  }
  if (base) embedding_backward(ctx, tokens, T, dh, E, grads.tok_embd.data());
  return Status();
}

}  // namespace dc
