// Activations: what Model::forward saves in training mode for Model::backward (llm.c style: the
// forward writes straight into these buffers instead of its scratch). All f32, row-major, in the memory
// ctx's ops read: host memory on the CPU, the device's on a device (DeviceMemory owned here; the fields are
// then device operands, ops/device.h, never dereferenced on the host).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/pages.h"
#include "core/status.h"
#include "model/lora_weights.h"

namespace dc {

class DeviceMemory;

// One layer's saved tensors: views into Activations' storage (nullptr: not kept).
struct LayerActivations {
  float* x = nullptr;      // [T, E]      residual stream entering the layer
  float* a1 = nullptr;     // [T, E]      attn_norm(x)
  float* q = nullptr;      // [T, H*D]    after RoPE
  float* k = nullptr;      // [T, Hkv*D]  after RoPE
  float* v = nullptr;      // [T, Hkv*D]
  float* attn = nullptr;   // [T, H*D]    attention output (before o_proj)
  float* h_mid = nullptr;  // [T, E]      x + o_proj(attn)
  float* a2 = nullptr;     // [T, E]      ffn_norm(h_mid)
  float* gate = nullptr;   // [T, F]      a2·W_gateᵀ (before SiLU)
  float* up = nullptr;     // [T, F]      a2·W_upᵀ
  float* act = nullptr;    // [T, F]      silu(gate)·up
  // A forward with unmerged LoRA adapters: u = dropout(x)·Aᵀ [T, r] of each adapted projection (nullptr
  // for a projection without adapter, or a forward without adapters).
  std::array<float*, kLoraTargets> lora_u{};
};

struct Activations {
  Activations();
  ~Activations();
  Activations(Activations&&) noexcept;
  Activations& operator=(Activations&&) noexcept;
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;

  // Set by the caller before the forward. true (gradient checkpointing): only each layer's input x is
  // kept; the backward recomputes the layer into `scratch`, so activation memory is n_layer·T·E plus one
  // layer instead of about n_layer·T·(5E + 2(H + Hkv)D + 3F) floats, for one more forward of compute.
  bool recompute = false;
  int64_t n_batch = 0, n_seq = 0;
  // Host copies of the forward's inputs (the backward uploads what it reads on a device).
  std::vector<int32_t> tokens;     // [T] T = n_batch · n_seq
  std::vector<uint8_t> valid;      // [T] or empty (every position valid)
  std::vector<float> cos, sin;     // [T, D/2] RoPE tables
  std::vector<int64_t> out_rows;   // [n_out] flat rows whose logits were computed
  std::vector<LayerActivations> layers;  // [n_layer]; with recompute only their x is kept
  LayerActivations scratch;              // with recompute: the one layer being computed
  float* final_x = nullptr;        // [n_out, E] residual stream of those rows before the final norm
  float* final_norm = nullptr;     // [n_out, E] output_norm(final_x), the lm_head input

  // Sizes every buffer for a batch of T positions and n_out logits rows on ctx's device (the CPU: host
  // vectors that keep their capacity across steps; a device: its memory, kept while large enough; a
  // field not kept gives its memory back). Buffers of the other device are dropped. On a device, call
  // inside a forward (the backend's lock held). Errors: the device's out of memory (kResourceExhausted);
  // on the CPU std::bad_alloc. `lora` (may be null): the adapters the forward adds, whose u it keeps.
  Status resize(const Context& ctx, int64_t n_layer, int64_t T, int64_t E, int64_t q_dim, int64_t kv_dim, int64_t F,
                int64_t n_out, const LoraWeights* lora = nullptr);
  // The device whose memory holds the fields (kCpu before the first resize).
  Device device() const { return device_; }
  // Bytes the fields hold now (the last resize's sizes, on its device).
  int64_t bytes() const;
  // Bytes resize() holds for these sizes, with or without `recompute`: what a device's training memory plan
  // counts (train/device_training.h) before the first forward. lora_ranks: Σ r over one layer's adapters.
  static int64_t bytes_for(bool recompute, int64_t n_layer, int64_t T, int64_t E, int64_t q_dim, int64_t kv_dim, int64_t F,
                           int64_t n_out, int64_t lora_ranks = 0);

 private:
  Device device_ = Device::kCpu;
  // The CPU's storage, one per field, in resize's order; the large ones not copied by a fork (core/pages.h).
  std::vector<std::vector<float, PageAllocator<float>>> host_;
  std::vector<std::unique_ptr<DeviceMemory>> device_memory_;  // a device's, the same order (null: empty)
  std::vector<int64_t> device_sizes_;                    // their sizes in floats
};

}  // namespace dc
