// ModelWeights: the Dream / Qwen2 tensors of a checkpoint, named per layer, bound to memory-mapped
// data in their stored dtype. Norm weights and biases (small) are held as f32 copies.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "ops/weight.h"
#include "types/model_config.h"

namespace dc {

struct LayerWeights {
  std::vector<float> attn_norm;   // [n_embd]            input_layernorm.weight
  WeightView wq;                  // [n_head*head_dim, n_embd]
  std::vector<float> bq;          // [n_head*head_dim]
  WeightView wk;                  // [n_head_kv*head_dim, n_embd]
  std::vector<float> bk;          // [n_head_kv*head_dim]
  WeightView wv;                  // [n_head_kv*head_dim, n_embd]
  std::vector<float> bv;          // [n_head_kv*head_dim]
  WeightView wo;                  // [n_embd, n_head*head_dim]  (no bias)
  std::vector<float> ffn_norm;    // [n_embd]            post_attention_layernorm.weight
  WeightView w_gate;              // [n_ff, n_embd]
  WeightView w_up;                // [n_ff, n_embd]
  WeightView w_down;              // [n_embd, n_ff]
};

struct ModelWeights {
  WeightView tok_embd;            // [n_vocab, n_embd]   model.embed_tokens.weight
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm; // [n_embd]            model.norm.weight
  WeightView output;              // [n_vocab, n_embd]   lm_head.weight (= tok_embd when tied)
};

// One tensor of the model as the visitor sees it: its checkpoint name, the shape config.json implies,
// and where it lives in ModelWeights (exactly one of matrix / vector is set).
struct WeightSlot {
  std::string name;
  std::vector<int64_t> shape;
  WeightView* matrix = nullptr;      // large weights, kept in their stored dtype
  std::vector<float>* vector = nullptr;  // norms and biases, held as f32
};

// Calls fn on every tensor the config implies, in checkpoint order (embeddings, layers, final norm,
// lm_head; lm_head is skipped when tied). `weights` gets its layers sized to config.n_layer.
void visit_weights(const ModelConfig& config, ModelWeights& weights, const std::function<void(const WeightSlot&)>& fn);

// Checks every expected tensor for presence, dtype (F32/F16/BF16) and shape, then binds the views.
// A checkpoint written by `diffucoder convert` (config.json with a "quantization" block, see
// model/quantize.h) may hold a matrix as codes + "<name>.scale" (+ "<name>.min"): their dtypes and
// shapes are checked against the block and the view gets that WeightQuant. Errors name the tensor, the
// file and the expected vs found dtype / shape. The checkpoint must outlive the result (views point
// into its mapped files).
Result<ModelWeights> bind_weights(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace dc
