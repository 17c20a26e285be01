// ModelParams: f32 tensors shaped like a model's weights, walked in visit_weights order. The trainer
// holds its master weights, gradients and both Adam moments as four of these (gemma.cpp style).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/weights.h"
#include "types/model_config.h"

namespace dc {

class ModelParams {
 public:
  struct Tensor {
    std::string name;             // checkpoint name, e.g. "model.layers.0.self_attn.q_proj.weight"
    std::vector<int64_t> shape;
    float* data = nullptr;        // into this object's storage
    int64_t size = 0;
    bool is_matrix = false;       // a 2-D weight (embeddings, projections); false: norm weight or bias
  };

  // Zero-filled tensors for every weight of `config`. With tied embeddings there is no lm_head tensor
  // and weights().output views tok_embd.
  static ModelParams zeros(const ModelConfig& config);
  // f32 copies (widened from bf16 / f16) of dense `src`; invalid_argument for quantized weights.
  static Result<ModelParams> from_weights(const ModelConfig& config, const ModelWeights& src);

  ModelParams() = default;
  ModelParams(ModelParams&&) = default;
  ModelParams& operator=(ModelParams&&) = default;
  ModelParams(const ModelParams&) = delete;
  ModelParams& operator=(const ModelParams&) = delete;

  // Views into this object's buffers (valid while it lives, also after a move); matrices are f32.
  const ModelWeights& weights() const { return *weights_; }
  ModelWeights& weights() { return *weights_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(const std::string& name) const;
  int64_t n_values() const;
  void zero();

 private:
  std::unique_ptr<ModelWeights> weights_;  // stable address: vector slots hold the storage themselves
  std::vector<std::unique_ptr<std::vector<float>>> matrices_;
  std::vector<Tensor> tensors_;
};

}  // namespace dc
