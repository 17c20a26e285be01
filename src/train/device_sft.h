// The SFT Trainer's loss on a device (a Trainer created with a device Context; its state and optimizer step:
// train/device_training.h). A micro-batch's forward (training mode, its activations in device memory), lm_head
// on the loss rows, masked cross-entropy and backward run there. What crosses to the host: the batch (tokens,
// positions, mask, loss rows, targets, weights: inputs) and the micro-batch's loss. A LoRA run's the same way
// (train/device_lora_training.h).
#pragma once

#include "core/context.h"
#include "core/status.h"
#include "model/transformer.h"
#include "train/device_lora_training.h"
#include "train/device_training.h"
#include "train/masked_diffusion.h"

namespace dc::train {

struct LossTimes;

// loss_and_grads (train/trainer.h) on the device: the training forward of `batch`, the lm_head on its loss
// rows, the weighted cross-entropy with weights·grad_scale (so dlogits are scaled: within rounding of the
// CPU's scaling after) and the head's backward in chunks of rows (DeviceLossRows: one chunk's logits on the device
// at a time), and Model::backward from the rows' gradient (one submission with the head: Model::record_backward),
// adding (kAdd) or writing (kOverwrite) device.grads().
// Returns the loss (unscaled: the device's sum ÷ grad_scale), downloaded.
Result<double> device_loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                                     Activations& acts, GradWrite write, LossTimes* times, DeviceTraining& device);
// The same for LoRA adapters over a frozen `model` (loss_and_lora_grads on the device): the forward with
// batch.lora = &lora (its adapters uploaded by DeviceLoraTraining), Model::backward_lora ADDING into
// device.grads() (zeroed by the caller at the step's start).
Result<double> device_lora_loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch,
                                          float grad_scale, const LoraWeights& lora, Activations& acts, LossTimes* times,
                                          DeviceLoraTraining& device);

}  // namespace dc::train
