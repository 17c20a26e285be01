// ModelWeights: the Dream / Qwen2 tensors of a checkpoint, named per layer, as non-owning views: the
// matrices in their stored dtype (memory-mapped, packed or f32 master weights), norm weights and biases
// as f32 spans (into a VectorStore, or a ModelParams buffer). ModelSpans: the same tensors as writable
// f32 spans (gradients, ModelParams). One visitor walks both.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "ops/weight.h"
#include "types/model_config.h"

namespace dc {

// The tensors of one layer / of the model, each a `Matrix` or a `Vector` view (never owning).
template <class Matrix, class Vector>
struct LayerTensors {
  Vector attn_norm;  // [n_embd]            input_layernorm.weight
  Matrix wq;         // [n_head*head_dim, n_embd]
  Vector bq;         // [n_head*head_dim]
  Matrix wk;         // [n_head_kv*head_dim, n_embd]
  Vector bk;         // [n_head_kv*head_dim]
  Matrix wv;         // [n_head_kv*head_dim, n_embd]
  Vector bv;         // [n_head_kv*head_dim]
  Matrix wo;         // [n_embd, n_head*head_dim]  (no bias)
  Vector ffn_norm;   // [n_embd]            post_attention_layernorm.weight
  Matrix w_gate;     // [n_ff, n_embd]
  Matrix w_up;       // [n_ff, n_embd]
  Matrix w_down;     // [n_embd, n_ff]
};

template <class Matrix, class Vector>
struct ModelTensors {
  Matrix tok_embd;     // [n_vocab, n_embd]   model.embed_tokens.weight
  std::vector<LayerTensors<Matrix, Vector>> layers;
  Vector output_norm;  // [n_embd]            model.norm.weight
  Matrix output;       // [n_vocab, n_embd]   lm_head.weight (= tok_embd when tied)
};

using VectorView = std::span<const float>;
using LayerWeights = LayerTensors<WeightView, VectorView>;  // what the forward reads
using ModelWeights = ModelTensors<WeightView, VectorView>;
using LayerSpans = LayerTensors<std::span<float>, std::span<float>>;  // writable f32 (Model::backward's grads)
struct ModelSpans : ModelTensors<std::span<float>, std::span<float>> {
  // When set (ModelParams::set_layer_done): called by Model::backward once layer il's gradients are
  // complete (the layers run from the last to the first), before it writes layer il − 1's; an error
  // stops the backward. ZeRO-2 reduces the layer there and clears the storage all layers' spans share.
  std::function<Status(int64_t il)> on_layer_done;
  // When set (ModelParams::set_head_done): called by Model::backward once the lm_head's and the final
  // norm's gradients are complete, before it writes any layer's or the embedding table's; an error stops
  // the backward. ZeRO-2 reduces them there and clears the storage the lm_head's shares with the table's.
  std::function<Status()> on_head_done;
};

// Calls fn(name, shape, matrix, vector) on every tensor the config implies, in checkpoint order
// (embeddings, layers, final norm, lm_head; lm_head is skipped when tied), with exactly one of the
// pointers `matrix` / `vector` into `tree` set. A non-const tree gets its layers sized to
// config.n_layer; a const one must have them already.
template <class Tree, class Fn>
void visit_tensors(const ModelConfig& c, Tree& w, Fn&& fn) {
  using Matrix = std::remove_reference_t<decltype((w.tok_embd))>;  // const when Tree is
  using Vector = std::remove_reference_t<decltype((w.output_norm))>;
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  auto mat = [&](std::string name, int64_t rows, int64_t cols, Matrix* m) {
    fn(std::move(name), std::vector<int64_t>{rows, cols}, m, static_cast<Vector*>(nullptr));
  };
  auto vec = [&](std::string name, int64_t n, Vector* v) {
    fn(std::move(name), std::vector<int64_t>{n}, static_cast<Matrix*>(nullptr), v);
  };
  auto layer_name = [](int64_t i, const char* suffix) { return "model.layers." + std::to_string(i) + "." + suffix; };
  mat("model.embed_tokens.weight", c.n_vocab, c.n_embd, &w.tok_embd);
  if constexpr (std::is_const_v<Tree>) {
    DC_CHECK(static_cast<int64_t>(w.layers.size()) == c.n_layer, "visit_tensors: a const tree needs config.n_layer layers");
  } else {
    w.layers.resize(c.n_layer);
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    auto& l = w.layers[i];
    vec(layer_name(i, "input_layernorm.weight"), c.n_embd, &l.attn_norm);
    mat(layer_name(i, "self_attn.q_proj.weight"), q_dim, c.n_embd, &l.wq);
    vec(layer_name(i, "self_attn.q_proj.bias"), q_dim, &l.bq);
    mat(layer_name(i, "self_attn.k_proj.weight"), kv_dim, c.n_embd, &l.wk);
    vec(layer_name(i, "self_attn.k_proj.bias"), kv_dim, &l.bk);
    mat(layer_name(i, "self_attn.v_proj.weight"), kv_dim, c.n_embd, &l.wv);
    vec(layer_name(i, "self_attn.v_proj.bias"), kv_dim, &l.bv);
    mat(layer_name(i, "self_attn.o_proj.weight"), c.n_embd, q_dim, &l.wo);
    vec(layer_name(i, "post_attention_layernorm.weight"), c.n_embd, &l.ffn_norm);
    mat(layer_name(i, "mlp.gate_proj.weight"), c.n_ff, c.n_embd, &l.w_gate);
    mat(layer_name(i, "mlp.up_proj.weight"), c.n_ff, c.n_embd, &l.w_up);
    mat(layer_name(i, "mlp.down_proj.weight"), c.n_embd, c.n_ff, &l.w_down);
  }
  vec("model.norm.weight", c.n_embd, &w.output_norm);
  if (!c.tie_word_embeddings) mat("lm_head.weight", c.n_vocab, c.n_embd, &w.output);
}

// One tensor of ModelWeights as visit_weights sees it: its checkpoint name, the shape config.json
// implies, and where its view lives (exactly one of matrix / vector is set).
struct WeightSlot {
  std::string name;
  std::vector<int64_t> shape;
  WeightView* matrix = nullptr;  // large weights, kept in their stored dtype
  VectorView* vector = nullptr;  // norms and biases, f32 (point it into a VectorStore)
};

// visit_tensors over ModelWeights, one WeightSlot per tensor.
void visit_weights(const ModelConfig& config, ModelWeights& weights, const std::function<void(const WeightSlot&)>& fn);

// f32 storage for the norm weights and biases of one ModelWeights of `config`, allocated once so that
// the spans it hands out never move. Whoever builds the ModelWeights keeps it alive as long as the views
// (Model::load keeps it as the model's storage).
class VectorStore {
 public:
  explicit VectorStore(const ModelConfig& config);
  // The next n values (zeros) for the caller to fill and view. DC_CHECKs that they fit in the config's.
  std::span<float> take(int64_t n);

 private:
  std::vector<float> values_;
  size_t used_ = 0;
};

// Checks every expected tensor for presence, dtype (F32/F16/BF16) and shape, then binds the views; the
// norm weights and biases are widened to f32 into `vectors`. A checkpoint written by `diffucoder
// convert` (config.json with a "quantization" block, see model/quantize.h) may hold a matrix as codes +
// "<name>.scale" (+ "<name>.min"): their dtypes and shapes are checked against the block and the view gets
// that WeightQuant. Errors name the tensor, the file and the expected vs found dtype / shape. The
// checkpoint and `vectors` (made for this config) must outlive the result.
Result<ModelWeights> bind_weights(const Checkpoint& checkpoint, const ModelConfig& config, VectorStore& vectors);

}  // namespace dc
