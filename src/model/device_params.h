// DeviceParams: f32 tensors shaped like a model's weights in a device's memory, one buffer per tensor (a
// device operand is the start of a buffer, never an offset into one): what Model::backward writes its
// gradients into on a device, seen as ModelSpans of device operands (ops/device.h), downloaded into a
// ModelParams of the same config.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "model/params.h"
#include "model/weights.h"
#include "types/model_config.h"

namespace dc {

class DeviceMemory;

class DeviceParams {
 public:
  // Every tensor of `config` on ctx's device (a device context), zero-filled. With tied embeddings the
  // spans' output is tok_embd, as in ModelParams. Errors: the device's out of memory (kResourceExhausted,
  // naming the tensor).
  static Result<DeviceParams> zeros(const Context& ctx, const ModelConfig& config);

  DeviceParams();
  ~DeviceParams();
  DeviceParams(DeviceParams&&) noexcept;
  DeviceParams& operator=(DeviceParams&&) noexcept;

  // The tensors as writable spans of device operands (Model::backward's grads on ctx's device); their
  // memory lives as long as this object.
  const ModelSpans& spans() const { return spans_; }
  // Zeroes every tensor (one submission).
  Status zero(const Context& ctx);
  // Copies every tensor into `host` (a ModelParams::zeros of the same config), one submission.
  Status download(const Context& ctx, ModelParams& host) const;
  // Copies every tensor of `host` (a ModelParams of the same config) in, through one named staging buffer
  // of the largest tensor's size (a submission per tensor: for a resume, not per step).
  Status upload(const Context& ctx, const ModelParams& host);
  // Each tensor's name (checkpoint name) and device span, in visit_tensors order (ModelParams::tensors()'s).
  struct Tensor {
    std::string name;
    std::span<float> data;
  };
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  ModelConfig config_;
  std::vector<std::unique_ptr<DeviceMemory>> memory_;  // visit_tensors order
  ModelSpans spans_;
  std::vector<Tensor> tensors_;
  // host's tensors against tensors_ (names and sizes), or invalid_argument naming the first that differs.
  Status check_host(const ModelParams& host, const char* what) const;
};

}  // namespace dc
