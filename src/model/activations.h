// Activations: what Model::forward saves in training mode for Model::backward (llm.c style: the
// forward writes straight into these buffers instead of its scratch). All f32, row-major.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "model/lora_weights.h"

namespace dc {

struct LayerActivations {
  std::vector<float> x;      // [T, E]      residual stream entering the layer
  std::vector<float> a1;     // [T, E]      attn_norm(x)
  std::vector<float> q;      // [T, H*D]    after RoPE
  std::vector<float> k;      // [T, Hkv*D]  after RoPE
  std::vector<float> v;      // [T, Hkv*D]
  std::vector<float> attn;   // [T, H*D]    attention output (before o_proj)
  std::vector<float> h_mid;  // [T, E]      x + o_proj(attn)
  std::vector<float> a2;     // [T, E]      ffn_norm(h_mid)
  std::vector<float> gate;   // [T, F]      a2·W_gateᵀ (before SiLU)
  std::vector<float> up;     // [T, F]      a2·W_upᵀ
  std::vector<float> act;    // [T, F]      silu(gate)·up
  // A forward with unmerged LoRA adapters: u = dropout(x)·Aᵀ [T, r] of each adapted projection (else empty).
  std::array<std::vector<float>, kLoraTargets> lora_u;
};

struct Activations {
  // Set by the caller before the forward. true (gradient checkpointing): only each layer's input x is
  // kept; the backward recomputes the layer into `scratch`, so activation memory is n_layer·T·E plus one
  // layer instead of about n_layer·T·(5E + 2(H + Hkv)D + 3F) floats, for one more forward of compute.
  bool recompute = false;
  int64_t n_batch = 0, n_seq = 0;
  std::vector<int32_t> tokens;     // [T] T = n_batch · n_seq
  std::vector<uint8_t> valid;      // [T] or empty (every position valid)
  std::vector<float> cos, sin;     // [T, D/2] RoPE tables
  std::vector<LayerActivations> layers;  // [n_layer]; with recompute only their x is sized
  LayerActivations scratch;              // with recompute: the one layer being computed
  std::vector<int64_t> out_rows;   // [n_out] flat rows whose logits were computed
  std::vector<float> final_x;      // [n_out, E] residual stream of those rows before the final norm
  std::vector<float> final_norm;   // [n_out, E] output_norm(final_x), the lm_head input

  // Sizes every buffer for a batch of T positions and n_out logits rows (keeps capacity across steps).
  void resize(int64_t n_layer, int64_t T, int64_t E, int64_t q_dim, int64_t kv_dim, int64_t F, int64_t half_dim,
              int64_t n_out) {
    auto size = [&](LayerActivations& l, bool all) {
      const int64_t n = all ? T : 0;
      l.x.resize(T * E), l.a1.resize(n * E), l.q.resize(n * q_dim), l.k.resize(n * kv_dim);
      l.v.resize(n * kv_dim), l.attn.resize(n * q_dim), l.h_mid.resize(n * E), l.a2.resize(n * E);
      l.gate.resize(n * F), l.up.resize(n * F), l.act.resize(n * F);
      if (!all) {  // give the memory back
        LayerActivations kept;
        kept.x = std::move(l.x);
        l = std::move(kept);
      }
    };
    layers.resize(n_layer);
    for (LayerActivations& l : layers) size(l, !recompute);
    if (recompute) size(scratch, true);
    else scratch = LayerActivations{};
    tokens.resize(T), cos.resize(T * half_dim), sin.resize(T * half_dim);
    out_rows.resize(n_out), final_x.resize(n_out * E), final_norm.resize(n_out * E);
  }
};

}  // namespace dc
