// bind_weights: the table of expected Dream tensors and the load-time checks against config.json.
#include "model/weights.h"

#include <sstream>

namespace dc {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string layer_name(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

}  // namespace

void visit_weights(const ModelConfig& c, ModelWeights& w, const std::function<void(const WeightSlot&)>& fn) {
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  auto mat = [&](std::string name, std::vector<int64_t> shape, WeightView* m) { fn({std::move(name), std::move(shape), m, nullptr}); };
  auto vec = [&](std::string name, int64_t n, std::vector<float>* v) { fn({std::move(name), {n}, nullptr, v}); };
  mat("model.embed_tokens.weight", {c.n_vocab, c.n_embd}, &w.tok_embd);
  w.layers.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = w.layers[i];
    vec(layer_name(i, "input_layernorm.weight"), c.n_embd, &l.attn_norm);
    mat(layer_name(i, "self_attn.q_proj.weight"), {q_dim, c.n_embd}, &l.wq);
    vec(layer_name(i, "self_attn.q_proj.bias"), q_dim, &l.bq);
    mat(layer_name(i, "self_attn.k_proj.weight"), {kv_dim, c.n_embd}, &l.wk);
    vec(layer_name(i, "self_attn.k_proj.bias"), kv_dim, &l.bk);
    mat(layer_name(i, "self_attn.v_proj.weight"), {kv_dim, c.n_embd}, &l.wv);
    vec(layer_name(i, "self_attn.v_proj.bias"), kv_dim, &l.bv);
    mat(layer_name(i, "self_attn.o_proj.weight"), {c.n_embd, q_dim}, &l.wo);
    vec(layer_name(i, "post_attention_layernorm.weight"), c.n_embd, &l.ffn_norm);
    mat(layer_name(i, "mlp.gate_proj.weight"), {c.n_ff, c.n_embd}, &l.w_gate);
    mat(layer_name(i, "mlp.up_proj.weight"), {c.n_ff, c.n_embd}, &l.w_up);
    mat(layer_name(i, "mlp.down_proj.weight"), {c.n_embd, c.n_ff}, &l.w_down);
  }
  vec("model.norm.weight", c.n_embd, &w.output_norm);
  if (!c.tie_word_embeddings) mat("lm_head.weight", {c.n_vocab, c.n_embd}, &w.output);
}

Result<ModelWeights> bind_weights(const Checkpoint& checkpoint, const ModelConfig& c) {
  ModelWeights w;
  Status status;
  visit_weights(c, w, [&](const WeightSlot& slot) {
    if (!status.ok()) return;
    const TensorInfo* t = checkpoint.find(slot.name);
    if (t == nullptr) {
      status = not_found("tensor '" + slot.name + "' is missing from the checkpoint in " + checkpoint.dir() +
                         " (is this a Dream/DiffuCoder checkpoint, and are all shards present?)");
    } else if (t->shape != slot.shape) {
      status = invalid_argument("tensor '" + slot.name + "' in " + t->file + " has shape " + shape_str(t->shape) +
                                " but config.json implies " + shape_str(slot.shape));
    } else if (slot.matrix != nullptr) {
      *slot.matrix = WeightView{t->dtype, t->data, slot.shape[0], slot.shape.size() > 1 ? slot.shape[1] : 1};
    } else {
      slot.vector->resize(slot.shape[0]);
      convert_to_f32(t->dtype, t->data, slot.vector->data(), slot.vector->size());
    }
  });
  if (!status.ok()) return status;
  if (c.tie_word_embeddings) w.output = w.tok_embd;
  return w;
}

}  // namespace dc
