// Unmerged LoRA adapters over a model's projections, as the forward and the backward read them:
//   y = x·Wᵀ + b + scale · (dropout(x)·Aᵀ)·Bᵀ        A [r, in], B [out, r], f32
// (PEFT's LoRA layer; docs/lora.md). Non-owning views: lora/ fills them from a PEFT adapter, train/ over
// the trainable values it updates in place. A ForwardBatch carries them (ForwardBatch::lora).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dc {

// The seven projections of a layer an adapter may target, in PEFT's module names' order of a Qwen2 layer.
enum LoraTarget : int { kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown, kLoraTargets };

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
inline const char* lora_target_name(int t) {
  static const char* const kNames[kLoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return kNames[t];
}
// The module's path in a Qwen2 model: "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.up_proj".
inline std::string lora_module_path(int64_t layer, int t) {
  return "model.layers." + std::to_string(layer) + (t <= kLoraO ? ".self_attn." : ".mlp.") + lora_target_name(t);
}

// One adapted projection (a == nullptr: the projection has no adapter).
struct LoraMatrix {
  const float* a = nullptr;  // [r, in]
  const float* b = nullptr;  // [out, r]
  int64_t r = 0;
  float scale = 0;           // alpha / r (alpha / √r with rsLoRA)
  bool empty() const { return a == nullptr; }
};

struct LoraWeights {
  std::vector<std::array<LoraMatrix, kLoraTargets>> layers;  // [n_layer]
  // Dropout on the adapters' input, in a training-mode forward only (PEFT's lora_dropout): x scaled by
  // 1/(1 − p) where kept, each value kept or dropped by a hash of (dropout_key, layer, target, row, column)
  // (ops/dropout.h), so that the backward draws the same mask again, and a device the CPU's. The trainer sets a
  // fresh key per micro-batch.
  float dropout = 0;
  uint64_t dropout_key = 0;
};

// Where a backward writes the adapters' gradients: per layer and target, dA [r, in] and dB [out, r]
// (null for a projection without adapter), shaped as LoraWeights' matrices.
struct LoraGradMatrix {
  float* a = nullptr;
  float* b = nullptr;
};
struct LoraGrads {
  std::vector<std::array<LoraGradMatrix, kLoraTargets>> layers;  // [n_layer]
};

}  // namespace dc
