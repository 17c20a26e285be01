// KvCache: the keys (after RoPE) and values of every layer at every position of a batch, written by a
// refresh forward and read (and partly overwritten) by window forwards (Fast-dLLM, spec §6); in host memory
// for the CPU, resident on the device for a DeviceBackend.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/pages.h"
#include "core/status.h"
#include "ops/device.h"

namespace dc {

class KvCache {
 public:
  // Bytes held for n_layer layers of K and V [n_batch, n_seq, kv_dim] f32: 2·n_layer·n_batch·n_seq·kv_dim·4.
  static int64_t bytes_for(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim);

  // Sizes the cache for this shape on ctx's device (host memory on the CPU, the backend's memory on a
  // device: called inside its forward) and marks it empty (no refresh yet); keeps the memory when the shape
  // and the device are unchanged. Errors (resource_exhausted) when the allocation fails.
  Status reset(const Context& ctx, int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim);

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
  // The device holding the cache (null: host memory, the CPU's).
  const DeviceBackend* backend() const { return backend_; }

  // [n_batch, n_seq, kv_dim] of one layer: host pointers, or on a device the forward's operands that carry
  // its DevicePtr (ops/device.h as_operand).
  float* k(int64_t layer) { return device_.empty() ? k_.data() + layer * layer_size() : as_operand(device_[2 * layer]->data()); }
  float* v(int64_t layer) { return device_.empty() ? v_.data() + layer * layer_size() : as_operand(device_[2 * layer + 1]->data()); }
  const float* k(int64_t layer) const { return const_cast<KvCache*>(this)->k(layer); }
  const float* v(int64_t layer) const { return const_cast<KvCache*>(this)->v(layer); }

 private:
  int64_t layer_size() const { return n_batch_ * n_seq_ * kv_dim_; }
  void clear();

  int64_t n_layer_ = 0, n_batch_ = 0, n_seq_ = 0, kv_dim_ = 0;
  bool filled_ = false;
  // [n_layer, n_batch, n_seq, kv_dim] each, on the CPU; not copied by a fork when large (core/pages.h).
  std::vector<float, PageAllocator<float>> k_, v_;
  const DeviceBackend* backend_ = nullptr;              // the device holding device_ (null: the CPU)
  std::vector<std::unique_ptr<DeviceMemory>> device_;  // K, V of layer 0, K, V of layer 1, ... on a device
};

}  // namespace dc
