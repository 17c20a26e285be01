// DeviceLoraTraining: a LoRA run's state on a device (train --lora-r R --device vulkan): the frozen base uploaded
// as stored (Model::to_device), the adapters' device copies (Model::lora_to_device; f32, updated in place by AdamW
// through DeviceBackend::weight_memory), their gradients and both Adam moments (DeviceLora). The optimizer step
// is DeviceTraining's (device_adamw_step): one submission, the global norm, clip and AdamW there, the norm read
// back as the metric. Checkpoints download the adapters and moments into the LoraCore first (sync_to_host), which
// writes them in PEFT's layout. The base's and the adapters' copies are this object's: stale copies at their host
// addresses are dropped at start and its own on destruction (before the backend's).
// Over data-parallel ranks (one device each) every rank holds the whole state on its device (the adapters are
// small); the step downloads the adapters' gradients, LoraCore::step sums them over the ranks (rank order) and
// computes the norm and clip on the host, and each rank uploads the sum and runs the same AdamW on its device:
// per step and rank 4·A bytes down and 4·A up (A adapter values).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "lora/device_lora.h"
#include "model/transformer.h"
#include "train/device_training.h"
#include "train/lora_core.h"

namespace dc::train {

class DeviceLoraTraining {
 public:
  // Uploads `base` and core's adapters (the saved ones when it has resumed, with their moments) to ctx's device
  // and allocates zero gradients and moments; with `reference` (GRPO's reference adapters over the same base, of
  // core's shapes) uploads those too. Before any upload the plan (plan_device_training with the adapters) is
  // logged and checked against the device's memory: a run that would not fit is refused (kResourceExhausted)
  // with its sizes and what would make it fit. Errors: the device's (out of memory, naming the tensor).
  static Result<std::unique_ptr<DeviceLoraTraining>> start(const Context& ctx, const Model& base, const LoraCore& core,
                                                           const DeviceBatchShape& batch,
                                                           const LoraParams* reference = nullptr);
  ~DeviceLoraTraining();

  DeviceLora& grads() { return grads_; }
  DeviceLossRows& rows() { return rows_; }
  // LoraCore::step on the device: the adapters' global Σ g², clip and AdamW at the schedule's rate in one
  // submission; a non-finite loss or norm skips the update. The step is counted in `core`. Over ranks (every rank
  // calls it): the gradients summed and the norm computed on the host (LoraCore::step), AdamW on the device.
  Result<OptimizerStepStats> step(const Context& ctx, LoraCore& core, double loss);
  // Downloads the adapters and moments into core's host buffers (before LoraCore::save).
  Status sync_to_host(const Context& ctx, LoraCore& core) const;
  // Makes the device's copy of start()'s `reference` adapters their host values again (after GRPO's sync mixed
  // them on the host): the copies are dropped and uploaded anew (`base`: a model of start()'s config).
  Status refresh_reference(const Context& ctx, const Model& base, const LoraParams& reference) const;

 private:
  DeviceLoraTraining() = default;
  DeviceBackend* backend_ = nullptr;  // whose copies hosts_ names, dropped on destruction
  std::vector<const void*> hosts_;    // the base's and the adapters' host addresses: the backend's keys, never read
  std::vector<float*> params_;        // each adapter tensor's device copy (LoraParams::tensors() order)
  DeviceLora grads_, m_, v_;
  DeviceLossRows rows_;
};

}  // namespace dc::train
