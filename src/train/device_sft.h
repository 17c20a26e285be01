// DeviceSft: the SFT Trainer's state and step on a device (a Trainer created with a device Context). The f32
// master weights are the device's copy of the model's weights (Model::to_device, updated in place by AdamW
// through DeviceBackend::weight_memory); the gradients and both Adam moments are DeviceParams. A micro-batch's
// forward (training mode, its activations in device memory), lm_head on the loss rows, masked cross-entropy
// and backward run there, and so do the clipping and AdamW. What crosses to the host per step: the batch
// (tokens, positions, mask, loss rows, targets, weights: inputs) and the metrics — each micro-batch's loss and
// each tensor's Σ g², from which the host takes the global norm and decides clipping and skipping as
// OptimizerCore::step does. Checkpoints download the weights and moments into the OptimizerCore first.
// One process, full fine-tuning, f32 (no LoRA, ranks or mixed precision on a device yet: Trainer refuses them).
#pragma once

#include <cstdint>
#include <memory>

#include "core/context.h"
#include "core/status.h"
#include "model/device_params.h"
#include "model/transformer.h"
#include "train/masked_diffusion.h"
#include "train/optimizer_core.h"

namespace dc::train {

struct LossTimes;

class DeviceSft {
 public:
  // Uploads `model`'s weights (f32: a model over core.params()) and core's moments to ctx's device (a device
  // context), with zero gradients. Errors: the device's out of memory (naming the tensor), weights not f32.
  static Result<std::unique_ptr<DeviceSft>> start(const Context& ctx, const Model& model, const OptimizerCore& core);
  ~DeviceSft();

  // loss_and_grads (train/trainer.h) on the device: the training forward of `batch`, the lm_head on its loss
  // rows, the weighted cross-entropy with weights·grad_scale (so dlogits are scaled: within rounding of the
  // CPU's scaling after), and Model::backward adding (kAdd) or writing (kOverwrite) the gradients. Returns the
  // loss (unscaled: the device's sum ÷ grad_scale), downloaded.
  Result<double> loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                                Activations& acts, GradWrite write, LossTimes* times);
  // OptimizerCore::step on the device (an unsharded core in f32): the global norm from each tensor's Σ g²,
  // a non-finite loss or norm skips the update, else AdamW with clip_coefficient's scale at
  // learning_rate(core's schedule); the step is counted in `core`.
  Result<OptimizerStepStats> step(const Context& ctx, OptimizerCore& core, double loss);
  // Downloads the weights and moments into core's host buffers (before OptimizerCore::save).
  Status sync_to_host(const Context& ctx, OptimizerCore& core) const;

 private:
  DeviceSft() = default;
  ModelConfig config_;
  ModelSpans params_;          // the device's weights, writable device operands (visit_tensors order)
  DeviceParams grads_, m_, v_;
  std::unique_ptr<DeviceMemory> hidden_, logits_;  // [n_out, E], [n_out, V] of the largest batch so far
  int64_t hidden_floats_ = 0, logits_floats_ = 0;
};

}  // namespace dc::train
