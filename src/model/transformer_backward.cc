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
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace dc {

Status Model::backward(const Context& ctx, Activations& acts, const float* dlogits, const ModelSpans& grads,
                       const ModelWeights* transposed, GradWrite write) const {
  const ProfileScope profile(ctx, "backward");
  Workspace own_workspace;  // without ctx.workspace, this call's scratch (freed on return)
  Context with_ws = ctx;
  if (with_ws.workspace == nullptr) with_ws.workspace = &own_workspace;
  try {
    return backward_body(with_ws, acts, dlogits, &grads, nullptr, nullptr, transposed, write);
  } catch (const std::bad_alloc&) {  // the workspace or the kernels' scratch (rethrown by the pool)
    return resource_exhausted("backward: out of memory for the gradients' workspace of " +
                              std::to_string(acts.n_batch) + " rows × " + std::to_string(acts.n_seq) +
                              " positions; use fewer rows, a shorter sequence or gradient checkpointing");
  }
}

namespace {

// kOverwrite: zeroes the gradients no product overwrites: the norm weights' (their backward adds, row by
// row) and an untied embedding table's (a scatter of the token rows; tied, the lm_head's dW writes it first).
void zero_added_grads(const Context& ctx, const ModelConfig& c, const ModelSpans& grads) {
  const ProfileScope profile(ctx, "zero the added gradients");
  for (const LayerSpans& g : grads.layers) {
    std::fill(g.attn_norm.begin(), g.attn_norm.end(), 0.0f);
    std::fill(g.ffn_norm.begin(), g.ffn_norm.end(), 0.0f);
  }
  std::fill(grads.output_norm.begin(), grads.output_norm.end(), 0.0f);
  if (c.tie_word_embeddings) return;
  zero_fill(ctx, grads.tok_embd.data(), static_cast<int64_t>(grads.tok_embd.size()));
}

}  // namespace

Status Model::backward_lora(const Context& ctx, Activations& acts, const float* dlogits, const LoraWeights& lora,
                            const LoraGrads& grads, const ModelWeights* transposed) const {
  const ProfileScope profile(ctx, "backward");
  if (lora.layers.size() != weights_.layers.size() || grads.layers.size() != weights_.layers.size())
    return invalid_argument("backward_lora: the adapters or their gradients are not shaped like this model's layers");
  Workspace own_workspace;
  Context with_ws = ctx;
  if (with_ws.workspace == nullptr) with_ws.workspace = &own_workspace;
  try {
    return backward_body(with_ws, acts, dlogits, nullptr, &lora, &grads, transposed, GradWrite::kAdd);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("backward: out of memory for the gradients' workspace of " +
                              std::to_string(acts.n_batch) + " rows × " + std::to_string(acts.n_seq) +
                              " positions; use fewer rows, a shorter sequence or gradient checkpointing");
  }
}

Status Model::backward_body(const Context& ctx, Activations& acts, const float* dlogits, const ModelSpans* grads_in,
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
  const uint8_t* valid = acts.valid.empty() ? nullptr : acts.valid.data();
  if (base && write == GradWrite::kOverwrite) zero_added_grads(ctx, c, grads);
  std::vector<float> norm_sink(base ? 0 : E);  // a frozen base: the norm weights' gradients, discarded

  // The backward's buffers live in ctx.workspace (the trainer's: kept between steps, no allocation and
  // no page faults per step); each is written before it is read (the first product into it overwrites it),
  // dh zeroed here.
  Workspace& ws = *ctx.workspace;
  float* dh = ws.floats("backward.dh", T * E);  // [T, E] ∂loss/∂(residual stream)
  std::fill_n(dh, T * E, 0.0f);
  {  // lm_head and the final norm, on the n_out rows only
    std::vector<float> dnorm(n_out * E, 0.0f), dx(n_out * E, 0.0f);
    matmul_nt_backward(ctx, acts.final_norm.data(), n_out, weights_.output, dlogits, dnorm.data(),
                       at(grads.output), nullptr, transposed != nullptr && !transposed->output.empty() ? &transposed->output : nullptr, write);
    rms_norm_backward(ctx, acts.final_x.data(), weights_.output_norm.data(), dnorm.data(), n_out, E, eps, dx.data(),
                      base ? grads.output_norm.data() : norm_sink.data());
    for (int64_t r = 0; r < n_out; ++r) {  // rows may repeat: add in order
      float* dst = dh + acts.out_rows[r] * E;
      for (int64_t t = 0; t < E; ++t) dst[t] += dx[r * E + t];
    }
  }
  if (grads.on_head_done) DC_RETURN_IF_ERROR(grads.on_head_done());
  float* dbig1 = ws.floats("backward.dbig1", T * F);      // [T, F]
  float* dbig2 = ws.floats("backward.dbig2", T * F);      // [T, F]
  float* da = ws.floats("backward.da", T * E);            // [T, E]
  float* dq = ws.floats("backward.dq", T * q_dim);        // [T, H*D]
  float* dattn = ws.floats("backward.dattn", T * q_dim);  // [T, H*D]
  float* dk = ws.floats("backward.dk", T * kv_dim);       // [T, Hkv*D]
  float* dv = ws.floats("backward.dv", T * kv_dim);       // [T, Hkv*D]
  const AttentionShape shape{B, L, c.n_head, c.n_head_kv, D};
  ForwardBatch whole;  // what the training forward ran on: every position, no cache
  whole.n_batch = B, whole.n_seq = L, whole.valid = valid, whole.lora = lora;
  float* h_re = ws.floats("backward.h_re", acts.recompute ? T * E : 0);      // [T, E]
  float* tmp_re = ws.floats("backward.tmp_re", acts.recompute ? T * E : 0);  // [T, E]
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
      std::copy(acts.layers[il].x.begin(), acts.layers[il].x.end(), s.x.begin());
      std::copy(s.x.begin(), s.x.end(), h_re);
      LayerPass pass{&whole, T, acts.cos.data(), acts.sin.data(), h_re, tmp_re, nullptr};
      pass.a1 = s.a1.data(), pass.q = s.q.data(), pass.k = s.k.data(), pass.v = s.v.data();
      pass.attn = s.attn.data(), pass.h_mid = s.h_mid.data(), pass.a2 = s.a2.data();
      pass.gate = s.gate.data(), pass.up = s.up.data(), pass.act = s.act.data(), pass.lora_u = &s.lora_u;
      layer_forward(ctx, il, pass);
    }
    const LayerActivations& a = acts.recompute ? acts.scratch : acts.layers[il];
    // MLP: h_out = h_mid + act·W_downᵀ, act = silu(gate)·up, gate/up = a2·W_{gate,up}ᵀ, a2 = norm(h_mid)
    constexpr GradWrite kFirst = GradWrite::kOverwrite;  // the first product into dbig1 / da / dattn writes it
    // Each projection's backward with its LoRA adapter's, if any (x: the projection's saved input).
    auto proj = [&](const std::vector<float>& x, const WeightView& w, WeightView LayerWeights::*m, const float* dy,
                    float* dx, std::span<float> dw, std::span<float> dbias, GradWrite dx_write, int t) {
      const LoraGradMatrix* lg = lora_grads != nullptr ? &lora_grads->layers[il][t] : nullptr;
      lora_project_backward(ctx, x.data(), T, w, dy, dx, at(dw), base && !dbias.empty() ? dbias.data() : nullptr, wt(m),
                            write, dx_write, LoraSite{lora, il, t}, a.lora_u[t], lg);
    };
    // MLP: h_out = h_mid + act·W_downᵀ, act = silu(gate)·up, gate/up = a2·W_{gate,up}ᵀ, a2 = norm(h_mid)
    proj(a.act, l.w_down, &LayerWeights::w_down, dh, dbig1, g.w_down, {}, kFirst, kLoraDown);
    swiglu_backward(ctx, a.gate.data(), a.up.data(), dbig1, T * F, dbig1, dbig2);
    proj(a.a2, l.w_gate, &LayerWeights::w_gate, dbig1, da, g.w_gate, {}, kFirst, kLoraGate);
    proj(a.a2, l.w_up, &LayerWeights::w_up, dbig2, da, g.w_up, {}, GradWrite::kAdd, kLoraUp);
    rms_norm_backward(ctx, a.h_mid.data(), l.ffn_norm.data(), da, T, E, eps, dh, base ? g.ffn_norm.data() : norm_sink.data());
    // Attention: h_mid = x + attn·W_oᵀ
    proj(a.attn, l.wo, &LayerWeights::wo, dh, dattn, g.wo, {}, kFirst, kLoraO);
    attention_backward(ctx, shape, a.q.data(), a.k.data(), a.v.data(), valid, a.attn.data(), dattn, dq, dk, dv);
    rope_backward(ctx, dq, T, c.n_head, D, acts.cos.data(), acts.sin.data());
    rope_backward(ctx, dk, T, c.n_head_kv, D, acts.cos.data(), acts.sin.data());
    proj(a.a1, l.wq, &LayerWeights::wq, dq, da, g.wq, g.bq, kFirst, kLoraQ);
    proj(a.a1, l.wk, &LayerWeights::wk, dk, da, g.wk, g.bk, GradWrite::kAdd, kLoraK);
    proj(a.a1, l.wv, &LayerWeights::wv, dv, da, g.wv, g.bv, GradWrite::kAdd, kLoraV);
    rms_norm_backward(ctx, a.x.data(), l.attn_norm.data(), da, T, E, eps, dh, base ? g.attn_norm.data() : norm_sink.data());
    if (grads.on_layer_done) DC_RETURN_IF_ERROR(grads.on_layer_done(il));
  }
  if (base) embedding_backward(ctx, acts.tokens.data(), T, dh, E, grads.tok_embd.data());
  return Status();
}

}  // namespace dc
