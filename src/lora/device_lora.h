// DeviceLora: the tensors of a LoraParams (lora/trainable.h) on a device, one buffer each (a device operand
// is the start of a buffer, never an offset into one), seen as the LoraGrads of device operands that
// Model::backward_lora writes on a device: a device LoRA step's gradients and Adam moments. Downloaded into,
// and uploaded from, a LoraParams shaped alike (checkpoints and --resume).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "lora/trainable.h"
#include "model/lora_weights.h"

namespace dc {

class DeviceMemory;

class DeviceLora {
 public:
  // Every tensor of `like` on ctx's device (a device context), zero-filled. Errors: the device's out of
  // memory (kResourceExhausted, naming the tensor).
  static Result<DeviceLora> zeros_like(const Context& ctx, const LoraParams& like);

  DeviceLora();
  ~DeviceLora();
  DeviceLora(DeviceLora&&) noexcept;
  DeviceLora& operator=(DeviceLora&&) noexcept;

  // The tensors as LoraGrads of device operands, per layer and target as `like`'s adapters; their memory
  // lives as long as this object.
  const LoraGrads& grads() const { return grads_; }
  struct Tensor {
    std::string name;  // PEFT's, as LoraParams::Tensor's
    float* data;       // a device operand
    int64_t size;
  };
  const std::vector<Tensor>& tensors() const { return tensors_; }
  Status zero(const Context& ctx);  // one submission
  // Copies every tensor into `host` (shaped as `like`), one submission.
  Status download(const Context& ctx, LoraParams& host) const;
  // Copies every tensor of `host` (shaped as `like`) in (a submission per tensor: for a resume, not per step).
  Status upload(const Context& ctx, const LoraParams& host);

 private:
  std::vector<std::unique_ptr<DeviceMemory>> memory_;  // LoraParams::tensors() order
  std::vector<Tensor> tensors_;
  LoraGrads grads_;
  // host's tensors against tensors_ (names and sizes), or invalid_argument naming the first that differs.
  Status check_host(const LoraParams& host, const char* what) const;
};

}  // namespace dc
