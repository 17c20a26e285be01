// ModelParams: one buffer laid out in visit_weights order, its two views, widening of stored weights to f32.
#include "model/params.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>


namespace dc {

ModelParams ModelParams::zeros(const ModelConfig& config) { return make_zeros(config, false); }

ModelParams ModelParams::zeros_sharing_slots(const ModelConfig& config, int64_t layer_slots) {
  return make_zeros(config, true, std::max<int64_t>(1, layer_slots));
}

ModelParams ModelParams::make_zeros(const ModelConfig& config, bool share_slots, int64_t layer_slots) {
  ModelParams p;
  std::vector<int64_t> slot;  // share_slots: the offsets of layers 0…layer_slots−1's tensors, which the others reuse
  int64_t layer_tensors = 0;  // tensors of layers seen so far
  int64_t per_layer = 0;      // tensors per layer (layer 0's count, complete before layer 1's come)
  visit_tensors(config, p.spans_, [&](std::string name, std::vector<int64_t> shape, std::span<float>* m,
                                      std::span<float>*) {
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    const bool in_layer = name.rfind("model.layers.", 0) == 0;
    const int64_t il = in_layer ? std::stoll(name.substr(13)) : -1;  // "model.layers.<il>."
    per_layer += il == 0;
    const bool head = share_slots && name == "lm_head.weight";  // in the embedding table's slot (offset 0)
    const bool shared = head || (share_slots && in_layer && il >= layer_slots);
    const int64_t offset = head     ? 0
                           : shared ? slot[(il % layer_slots) * per_layer + (layer_tensors - il * per_layer)]
                                    : p.n_values_;
    if (share_slots && in_layer && !shared) slot.push_back(offset);
    layer_tensors += in_layer;
    p.tensors_.push_back({std::move(name), std::move(shape), nullptr, offset, size, m != nullptr});
    if (!shared) p.n_values_ += size;
  });
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(p.n_values_, 1)) * sizeof(float);
  p.buffer_ = alloc_page_array<float>(bytes);
  if (!p.buffer_) throw std::bad_alloc();
  std::memset(p.buffer_.get(), 0, bytes);
  size_t i = 0;
  visit_tensors(config, p.spans_, [&](const std::string&, const std::vector<int64_t>&, std::span<float>* m,
                                      std::span<float>* v) {
    Tensor& t = p.tensors_[i++];
    t.data = p.buffer_.get() + t.offset;
    *(m != nullptr ? m : v) = std::span<float>(t.data, static_cast<size_t>(t.size));
  });
  i = 0;
  visit_weights(config, p.weights_, [&](const WeightSlot& slot) {
    const Tensor& t = p.tensors_[i++];
    if (slot.matrix != nullptr) {
      *slot.matrix = WeightView{DType::kF32, t.data, t.shape[0], t.shape[1]};
    } else {
      *slot.vector = VectorView(t.data, static_cast<size_t>(t.size));
    }
  });
  if (config.tie_word_embeddings) {
    p.weights_.output = p.weights_.tok_embd;
    p.spans_.output = p.spans_.tok_embd;
  }
  return p;
}

Result<ModelParams> ModelParams::from_weights(const ModelConfig& config, const ModelWeights& src) {
  ModelParams p = zeros(config);
  size_t i = 0;
  Status status;
  visit_tensors(config, src, [&](const std::string& name, const std::vector<int64_t>&, const WeightView* m,
                                 const VectorView* v) {
    Tensor& t = p.tensors_[i++];
    if (!status.ok()) return;
    if (m != nullptr) {
      if (m->empty() || m->quantized() || m->rows * m->cols != t.size) {
        status = invalid_argument("cannot train " + name +
                                  ": training needs dense f32 / f16 / bf16 weights (not a quantized checkpoint)");
        return;
      }
      for (int64_t r = 0; r < m->rows; ++r) m->row_to_f32(r, t.data + r * m->cols);
    } else {
      if (static_cast<int64_t>(v->size()) != t.size) {
        status = invalid_argument(name + " has the wrong size");
        return;
      }
      std::copy(v->begin(), v->end(), t.data);
    }
  });
  if (!status.ok()) return status;
  return p;
}

Result<ModelParams> ModelParams::from_checkpoint(const Checkpoint& checkpoint) {
  VectorStore vectors(checkpoint.config());
  DC_ASSIGN_OR_RETURN(ModelWeights bound, bind_weights(checkpoint, checkpoint.config(), vectors));
  return from_weights(checkpoint.config(), bound);
}

const ModelParams::Tensor* ModelParams::find(const std::string& name) const {
  for (const Tensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

void ModelParams::zero() { std::fill_n(buffer_.get(), n_values_, 0.0f); }

}  // namespace dc
