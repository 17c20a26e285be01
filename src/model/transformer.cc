// The Dream forward pass (spec §2): embeddings, n_layer pre-norm blocks of bidirectional GQA attention
// with RoPE and q/k/v biases plus a SwiGLU MLP, final RMSNorm, lm_head on the requested rows only.
#include "model/transformer.h"

#include <vector>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace dc {

Result<std::unique_ptr<Model>> Model::load(const std::string& dir) {
  DC_ASSIGN_OR_RETURN(Checkpoint opened, Checkpoint::open(dir));
  auto checkpoint = std::make_shared<const Checkpoint>(std::move(opened));
  ModelConfig config = checkpoint->config();
  DC_ASSIGN_OR_RETURN(ModelWeights weights, bind_weights(*checkpoint, config));
  return std::unique_ptr<Model>(new Model(std::move(checkpoint), nullptr, std::move(config), std::move(weights)));
}

std::unique_ptr<Model> Model::from_weights(ModelConfig config, ModelWeights weights,
                                           std::shared_ptr<const void> storage) {
  return std::unique_ptr<Model>(new Model(nullptr, std::move(storage), std::move(config), std::move(weights)));
}

Status Model::check_batch(const ForwardBatch& b) const {
  if (b.n_batch <= 0 || b.n_seq <= 0) return invalid_argument("forward: empty batch");
  if (b.tokens == nullptr) return invalid_argument("forward: no tokens");
  if (b.n_out < 0 || (b.n_out > 0 && b.out_rows == nullptr)) return invalid_argument("forward: bad out_rows");
  const int64_t n = b.n_batch * b.n_seq;
  for (int64_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= config_.n_vocab)
      return invalid_argument("token id " + std::to_string(b.tokens[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(config_.n_vocab) + ")");
    if (b.positions != nullptr && b.positions[i] < 0)
      return invalid_argument("position id " + std::to_string(b.positions[i]) + " at index " + std::to_string(i) +
                              " is negative");
  }
  for (int64_t r = 0; r < b.n_out; ++r)
    if (b.out_rows[r] < 0 || b.out_rows[r] >= n)
      return invalid_argument("out_rows[" + std::to_string(r) + "] = " + std::to_string(b.out_rows[r]) +
                              " is outside the batch of " + std::to_string(n) + " rows");
  return Status();
}

Status Model::forward(const Context& ctx, const ForwardBatch& b, float* logits, const ForwardObserver* observer) const {
  DC_RETURN_IF_ERROR(check_batch(b));
  const ModelConfig& c = config_;
  const int64_t T = b.n_batch * b.n_seq, E = c.n_embd, D = c.head_dim, F = c.n_ff;
  const int64_t q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto observe = [&](const std::string& name, const float* data, std::vector<int64_t> shape) {
    if (observer != nullptr) (*observer)(name, data, shape);
  };

  std::vector<int32_t> positions(T);  // [T]
  for (int64_t i = 0; i < T; ++i)
    positions[i] = b.positions != nullptr ? b.positions[i] : static_cast<int32_t>(i % b.n_seq);
  std::vector<float> cos(T * D / 2), sin(T * D / 2);  // [T, D/2]
  rope_tables(positions.data(), T, D, c.rope_theta, cos.data(), sin.data());

  std::vector<float> h(T * E), a(T * E);                       // [T, E] residual stream, normed input
  std::vector<float> q(T * q_dim), k(T * kv_dim), v(T * kv_dim);  // [T, H*D], [T, Hkv*D]
  std::vector<float> attn(T * q_dim);                           // [T, H*D]
  std::vector<float> gate(T * F), up(T * F);                    // [T, F]
  const AttentionShape shape{b.n_batch, b.n_seq, c.n_head, c.n_head_kv, D};

  embedding(ctx, weights_.tok_embd, b.tokens, T, h.data());
  observe("embd", h.data(), {T, E});
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = weights_.layers[il];
    const std::string p = "L" + std::to_string(il) + ".";
    rms_norm(ctx, h.data(), l.attn_norm.data(), T, E, eps, a.data());
    observe(p + "attn_norm", a.data(), {T, E});
    matmul_nt(ctx, a.data(), T, l.wq, l.bq.data(), q.data());
    matmul_nt(ctx, a.data(), T, l.wk, l.bk.data(), k.data());
    matmul_nt(ctx, a.data(), T, l.wv, l.bv.data(), v.data());
    rope_apply(ctx, q.data(), T, c.n_head, D, cos.data(), sin.data());
    rope_apply(ctx, k.data(), T, c.n_head_kv, D, cos.data(), sin.data());
    observe(p + "q", q.data(), {T, q_dim});
    observe(p + "k", k.data(), {T, kv_dim});
    observe(p + "v", v.data(), {T, kv_dim});
    attention(ctx, shape, q.data(), k.data(), v.data(), b.valid, attn.data());
    observe(p + "attn", attn.data(), {T, q_dim});
    matmul_nt(ctx, attn.data(), T, l.wo, nullptr, a.data());
    add_inplace(ctx, h.data(), a.data(), T * E);
    observe(p + "attn_residual", h.data(), {T, E});
    rms_norm(ctx, h.data(), l.ffn_norm.data(), T, E, eps, a.data());
    observe(p + "ffn_norm", a.data(), {T, E});
    matmul_nt(ctx, a.data(), T, l.w_gate, nullptr, gate.data());
    matmul_nt(ctx, a.data(), T, l.w_up, nullptr, up.data());
    swiglu(ctx, gate.data(), up.data(), T * F, gate.data());
    matmul_nt(ctx, gate.data(), T, l.w_down, nullptr, a.data());
    add_inplace(ctx, h.data(), a.data(), T * E);
    observe(p + "out", h.data(), {T, E});
  }
  if (b.n_out == 0) return Status();
  std::vector<float> rows(b.n_out * E);  // [n_out, E]: only the rows whose logits are wanted
  for (int64_t r = 0; r < b.n_out; ++r)
    std::copy_n(h.data() + b.out_rows[r] * E, E, rows.data() + r * E);
  rms_norm(ctx, rows.data(), weights_.output_norm.data(), b.n_out, E, eps, rows.data());
  observe("output_norm", rows.data(), {b.n_out, E});
  matmul_nt(ctx, rows.data(), b.n_out, weights_.output, nullptr, logits);
  return Status();
}

}  // namespace dc
