// ModelParams: f32 tensors shaped like a model's weights, held in ONE contiguous buffer in
// visit_weights order (so one all-reduce, one AdamW pass or one memcpy covers them all) and seen as
// ModelWeights (the forward reads them) and ModelSpans (the backward writes them). The trainers hold
// their master weights, gradients and both Adam moments as four of these (gemma.cpp style).
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/pages.h"
#include "core/status.h"
#include "model/weights.h"
#include "types/model_config.h"

namespace dc {

class ModelParams {
 public:
  struct Tensor {
    std::string name;             // checkpoint name, e.g. "model.layers.0.self_attn.q_proj.weight"
    std::vector<int64_t> shape;
    float* data = nullptr;        // = this object's data() + offset
    int64_t offset = 0;           // into data(): the previous tensor's offset + size (no gaps; zeros_sharing_slots: see there)
    int64_t size = 0;
    bool is_matrix = false;       // a 2-D weight (embeddings, projections); false: norm weight or bias
  };

  // Zero-filled tensors for every weight of `config`, in one allocation (64-byte aligned; 2 MiB pages
  // from 2 MiB on). With tied embeddings there is no lm_head tensor and both views' output is tok_embd.
  // Throws std::bad_alloc when memory runs out (as a std::vector would).
  static ModelParams zeros(const ModelConfig& config);
  // Gradients laid out in shared slots (ZeRO-2, train/optimizer_core.h): the layers share `layer_slots`
  // layers' storage (layer il in slot il % layer_slots), and an untied lm_head shares the embedding
  // table's (zeros()'s layout without the layers ≥ layer_slots and the lm_head; tensors() lists them all,
  // those at the offsets of their slot's and of the table's). The backward's on_head_done (set_head_done)
  // must take the lm_head's values out and clear its slot before the embedding table's are written, and
  // on_layer_done (set_layer_done) layer il's before layer il − layer_slots's. n_values() counts the storage.
  static ModelParams zeros_sharing_slots(const ModelConfig& config, int64_t layer_slots = 1);
  // f32 copies (widened from bf16 / f16) of dense `src`; invalid_argument for quantized weights.
  static Result<ModelParams> from_weights(const ModelConfig& config, const ModelWeights& src);
  // The same of an opened checkpoint's weights, bound and checked against its config (bind_weights).
  static Result<ModelParams> from_checkpoint(const Checkpoint& checkpoint);

  ModelParams() = default;
  ModelParams(ModelParams&&) = default;
  ModelParams& operator=(ModelParams&&) = default;
  ModelParams(const ModelParams&) = delete;
  ModelParams& operator=(const ModelParams&) = delete;

  // Views into the buffer (valid while this object lives, also after a move): read-only f32 ModelWeights
  // for the forward, writable spans of the same values (e.g. Model::backward's gradients).
  const ModelWeights& weights() const { return weights_; }
  const ModelSpans& spans() { return spans_; }
  // Sets spans().on_layer_done (see Model::backward); an empty function unsets it.
  void set_layer_done(std::function<Status(int64_t il)> fn) { spans_.on_layer_done = std::move(fn); }
  // Sets spans().on_head_done (see Model::backward); an empty function unsets it.
  void set_head_done(std::function<Status()> fn) { spans_.on_head_done = std::move(fn); }
  // The buffer itself: n_values() floats, the tensors back to back in visit_weights order.
  float* data() { return buffer_.get(); }
  const float* data() const { return buffer_.get(); }
  int64_t n_values() const { return n_values_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Tensor* find(const std::string& name) const;
  void zero();

 private:
  static ModelParams make_zeros(const ModelConfig& config, bool share_slots, int64_t layer_slots = 1);
  PageArray<float> buffer_;  // [n_values_]
  int64_t n_values_ = 0;
  ModelWeights weights_;
  ModelSpans spans_;
  std::vector<Tensor> tensors_;
};

}  // namespace dc
