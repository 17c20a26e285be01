// Activations' storage (model/activations.h): host vectors on the CPU, DeviceMemory on a device, one per
// saved tensor, reused across steps while large enough.
#include "model/activations.h"

#include <algorithm>

#include "ops/device.h"

namespace dc {

Activations::Activations() = default;
Activations::~Activations() = default;
Activations::Activations(Activations&&) noexcept = default;
Activations& Activations::operator=(Activations&&) noexcept = default;

Status Activations::resize(const Context& ctx, int64_t n_layer, int64_t T, int64_t E, int64_t q_dim, int64_t kv_dim,
                           int64_t F, int64_t n_out, const LoraWeights* lora) {
  if (ctx.device != device_) {  // the other device's buffers go
    host_.clear(), device_memory_.clear(), device_sizes_.clear();
    device_ = ctx.device;
  }
  size_t slot = 0;  // the fields in a fixed order, so that each reuses its storage of the last step
  Status status;
  // Field `slot`'s storage of n floats (nullptr for none; the memory given back).
  auto take = [&](int64_t n) -> float* {
    const size_t i = slot++;
    if (ctx.device == Device::kCpu) {
      if (host_.size() <= i) host_.resize(i + 1);
      auto& v = host_[i];
      v.resize(n);
      if (n == 0) v.shrink_to_fit();
      return n > 0 ? v.data() : nullptr;
    }
    if (device_memory_.size() <= i) device_memory_.resize(i + 1), device_sizes_.resize(i + 1, 0);
    if (n == 0) {
      device_memory_[i].reset(), device_sizes_[i] = 0;
      return nullptr;
    }
    if (device_sizes_[i] < n) {
      device_memory_[i].reset(), device_sizes_[i] = 0;
      if (!status.ok()) return nullptr;
      auto memory = ctx.backend->allocate(n * static_cast<int64_t>(sizeof(float)), "the training activations");
      if (!memory.ok()) {
        status = memory.status();
        return nullptr;
      }
      device_memory_[i] = std::move(memory).value(), device_sizes_[i] = n;
    }
    return as_operand(device_memory_[i]->data());
  };
  // x of n_x rows, the rest of n rows (layer_floats counts the same).
  auto size = [&](LayerActivations& l, int64_t n_x, int64_t n) {
    l.x = take(n_x * E), l.a1 = take(n * E), l.q = take(n * q_dim), l.k = take(n * kv_dim), l.v = take(n * kv_dim);
    l.attn = take(n * q_dim), l.h_mid = take(n * E), l.a2 = take(n * E);
    l.gate = take(n * F), l.up = take(n * F), l.act = take(n * F);
  };
  layers.resize(n_layer);
  for (LayerActivations& l : layers) size(l, T, recompute ? 0 : T);
  size(scratch, recompute ? T : 0, recompute ? T : 0);
  final_x = take(n_out * E), final_norm = take(n_out * E);
  // Each adapter's u [n, r] (after every other field: runs with and without adapters share the rest).
  auto size_lora = [&](LayerActivations& l, const std::array<int64_t, kLoraTargets>& ranks, int64_t n) {
    for (int t = 0; t < kLoraTargets; ++t) l.lora_u[t] = take(n * ranks[t]);
  };
  std::array<int64_t, kLoraTargets> widest{};  // the scratch layer is any layer's: each target's largest r
  for (int64_t il = 0; il < n_layer; ++il) {
    std::array<int64_t, kLoraTargets> ranks{};
    for (int t = 0; t < kLoraTargets; ++t)
      if (lora != nullptr && !lora->layers[il][t].empty()) ranks[t] = lora->layers[il][t].r;
    for (int t = 0; t < kLoraTargets; ++t) widest[t] = std::max(widest[t], ranks[t]);
    size_lora(layers[il], ranks, recompute ? 0 : T);
  }
  size_lora(scratch, widest, recompute ? T : 0);
  return status;
}

int64_t Activations::bytes() const {
  int64_t floats = 0;
  if (device_ == Device::kCpu)
    for (const auto& v : host_) floats += static_cast<int64_t>(v.size());
  else
    for (int64_t n : device_sizes_) floats += n;
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t Activations::bytes_for(bool recompute, int64_t n_layer, int64_t T, int64_t E, int64_t q_dim, int64_t kv_dim, int64_t F,
                               int64_t n_out, int64_t lora_ranks) {
  // One layer's fields as resize's `size` lays them: x of n_x rows, the rest of n rows.
  auto layer_floats = [&](int64_t n_x, int64_t n) { return n_x * E + n * (3 * E + 2 * q_dim + 2 * kv_dim + 3 * F); };
  const int64_t floats = n_layer * layer_floats(T, recompute ? 0 : T) + layer_floats(recompute ? T : 0, recompute ? T : 0) +
                         2 * n_out * E + (recompute ? 1 : n_layer) * T * lora_ranks;  // + the adapters' u (each layer's alike)
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace dc
