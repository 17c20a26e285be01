// KvCache: the keys (after RoPE) and values of every layer at every position of a batch, written by a
// refresh forward and read (and partly overwritten) by window forwards (Fast-dLLM, spec §6).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace dc {

class KvCache {
 public:
  // Bytes held for n_layer layers of K and V [n_batch, n_seq, kv_dim] f32: 2·n_layer·n_batch·n_seq·kv_dim·4.
  static int64_t bytes_for(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim);

  // Sizes the cache for this shape and marks it empty (no refresh yet); keeps the memory when the shape
  // is unchanged. Errors (resource_exhausted) when the allocation fails.
  Status reset(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim);

  bool matches(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim) const {
    return n_layer == n_layer_ && n_batch == n_batch_ && n_seq == n_seq_ && kv_dim == kv_dim_;
  }
  // True after a refresh forward stored every position (set by the model).
  bool filled() const { return filled_; }
  void set_filled(bool filled) { filled_ = filled; }

  int64_t n_layer() const { return n_layer_; }
  int64_t n_batch() const { return n_batch_; }
  int64_t n_seq() const { return n_seq_; }
  int64_t kv_dim() const { return kv_dim_; }
  int64_t bytes() const { return bytes_for(n_layer_, n_batch_, n_seq_, kv_dim_); }

  float* k(int64_t layer) { return k_.data() + layer * layer_size(); }  // [n_batch, n_seq, kv_dim]
  float* v(int64_t layer) { return v_.data() + layer * layer_size(); }  // [n_batch, n_seq, kv_dim]
  const float* k(int64_t layer) const { return k_.data() + layer * layer_size(); }
  const float* v(int64_t layer) const { return v_.data() + layer * layer_size(); }

 private:
  int64_t layer_size() const { return n_batch_ * n_seq_ * kv_dim_; }

  int64_t n_layer_ = 0, n_batch_ = 0, n_seq_ = 0, kv_dim_ = 0;
  bool filled_ = false;
  std::vector<float> k_, v_;  // [n_layer, n_batch, n_seq, kv_dim] each
};

}  // namespace dc
