// ModelParams: allocation in visit_weights order, widening of stored weights to f32.
#include "model/params.h"

#include <algorithm>

namespace dc {

ModelParams ModelParams::zeros(const ModelConfig& config) {
  ModelParams p;
  p.weights_ = std::make_unique<ModelWeights>();
  visit_weights(config, *p.weights_, [&](const WeightSlot& slot) {
    int64_t size = 1;
    for (int64_t d : slot.shape) size *= d;
    Tensor t{slot.name, slot.shape, nullptr, size, slot.matrix != nullptr};
    if (slot.matrix != nullptr) {
      p.matrices_.push_back(std::make_unique<std::vector<float>>(size, 0.0f));
      t.data = p.matrices_.back()->data();
      *slot.matrix = WeightView{DType::kF32, t.data, slot.shape[0], slot.shape[1]};
    } else {
      slot.vector->assign(size, 0.0f);
      t.data = slot.vector->data();
    }
    p.tensors_.push_back(std::move(t));
  });
  if (config.tie_word_embeddings) p.weights_->output = p.weights_->tok_embd;
  return p;
}

Result<ModelParams> ModelParams::from_weights(const ModelConfig& config, const ModelWeights& src) {
  ModelParams p = zeros(config);
  ModelWeights& source = const_cast<ModelWeights&>(src);  // visit_weights only reads through the slots here
  size_t i = 0;
  Status status;
  visit_weights(config, source, [&](const WeightSlot& slot) {
    Tensor& t = p.tensors_[i++];
    if (!status.ok()) return;
    if (slot.matrix != nullptr) {
      const WeightView& w = *slot.matrix;
      if (w.empty() || w.quantized() || w.rows * w.cols != t.size) {
        status = invalid_argument("cannot train " + slot.name +
                                  ": training needs dense f32 / f16 / bf16 weights (not a quantized checkpoint)");
        return;
      }
      for (int64_t r = 0; r < w.rows; ++r) w.row_to_f32(r, t.data + r * w.cols);
    } else {
      if (static_cast<int64_t>(slot.vector->size()) != t.size) {
        status = invalid_argument(slot.name + " has the wrong size");
        return;
      }
      std::copy(slot.vector->begin(), slot.vector->end(), t.data);
    }
  });
  if (!status.ok()) return status;
  return p;
}

const ModelParams::Tensor* ModelParams::find(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t ModelParams::n_values() const {
  int64_t n = 0;
  for (const Tensor& t : tensors_) n += t.size;
  return n;
}

void ModelParams::zero() {
  for (Tensor& t : tensors_) std::fill_n(t.data, t.size, 0.0f);
}

}  // namespace dc
