// A projection with its optional unmerged LoRA adapter (model/lora_weights.h), forward and backward side
// by side; the transformer's forward and backward call these for each of a layer's seven projections.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "model/lora_weights.h"
#include "ops/matmul.h"
#include "ops/weight.h"

namespace dc {

// Which adapter a projection call reads: layer il, target t of `lora` (null: none).
struct LoraSite {
  const LoraWeights* lora = nullptr;
  int64_t il = 0;
  int t = 0;
  const LoraMatrix* matrix() const {
    return lora == nullptr || lora->layers[il][t].empty() ? nullptr : &lora->layers[il][t];
  }
};

// y[T, out] = x·wᵀ (+ bias) + scale · (x_d·Aᵀ)·Bᵀ, x_d = dropout(x) when `training` (else x).
// u (may be null): receives u = x_d·Aᵀ [T, r] (Activations' storage), what the backward reads.
// On a device (ctx.device kVulkan) x, y and u are its memory and A, B are read as uploaded
// (Model::lora_to_device); the dropout's mask is the CPU's (ops/dropout.h), x_d in the device's buffer lora.xd.
void lora_project(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* bias, float* y,
                  const LoraSite& site, bool training, float* u);

// Backward of lora_project (training mode): the base's matmul_nt_backward (dw and dbias may be null: a
// frozen base; w may then be quantized), then the adapter's: dB += scale·dyᵀ·u, du = scale·dy·B,
// dA += duᵀ·x_d, dx += du·A (through the dropout mask). `g` null: no adapter gradients.
// On a device every operand but the weights is its memory, g's too; the products are f32 (the frozen base's
// dx as matmul_nt_backward's, then dB += (scale·dy)ᵀ·u, du = (scale·dy)·B, dA += duᵀ·x_d, dx += du·A through
// the mask: x_d drawn again into lora.xd, du·A masked in lora.dxd).
void lora_project_backward(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* dy,
                           float* dx, float* dw, float* dbias, const WeightView* wt, GradWrite write,
                           GradWrite dx_write, const LoraSite& site, const float* u, const LoraGradMatrix* g);

}  // namespace dc
