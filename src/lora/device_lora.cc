// DeviceLora (lora/device_lora.h): one DeviceMemory per adapter tensor, zeroed and downloaded through the
// backend's ops in one submission each.
#include "lora/device_lora.h"

#include <unordered_map>

#include "ops/device.h"
#include "ops/elementwise.h"

namespace dc {

DeviceLora::DeviceLora() = default;
DeviceLora::~DeviceLora() = default;
DeviceLora::DeviceLora(DeviceLora&&) noexcept = default;
DeviceLora& DeviceLora::operator=(DeviceLora&&) noexcept = default;

Result<DeviceLora> DeviceLora::zeros_like(const Context& ctx, const LoraParams& like) {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "DeviceLora::zeros_like: a device context");
  DeviceLora d;
  std::unordered_map<const float*, float*> at;  // a tensor's host data in `like` → its device operand
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    for (const LoraParams::Tensor& t : like.tensors()) {
      DC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> memory,
                          ctx.backend->allocate(t.size * static_cast<int64_t>(sizeof(float)), "the tensor " + t.name));
      d.tensors_.push_back({t.name, as_operand(memory->data()), t.size});
      at.emplace(like.data() + t.offset, d.tensors_.back().data);
      d.memory_.push_back(std::move(memory));
    }
  }
  const LoraWeights& w = like.weights();
  d.grads_.layers.resize(w.layers.size());
  for (size_t il = 0; il < w.layers.size(); ++il)
    for (int t = 0; t < kLoraTargets; ++t)
      if (const LoraMatrix& m = w.layers[il][t]; !m.empty()) d.grads_.layers[il][t] = {at.at(m.a), at.at(m.b)};
  DC_RETURN_IF_ERROR(d.zero(ctx));
  return d;
}

Status DeviceLora::zero(const Context& ctx) {
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  for (const Tensor& t : tensors_) zero_fill(ctx, t.data, t.size);
  return ctx.backend->finish();
}

Status DeviceLora::check_host(const LoraParams& host, const char* what) const {
  const std::vector<LoraParams::Tensor>& h = host.tensors();
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (i >= h.size() || h[i].name != tensors_[i].name || h[i].size != tensors_[i].size)
      return invalid_argument(std::string(what) + ": the host adapters are not shaped like " + tensors_[i].name);
  if (h.size() != tensors_.size()) return invalid_argument(std::string(what) + ": the host adapters have more tensors");
  return Status();
}

Status DeviceLora::download(const Context& ctx, LoraParams& host) const {
  DC_RETURN_IF_ERROR(check_host(host, "DeviceLora::download"));
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    ctx.backend->copy_out(t.name.c_str(), as_device(static_cast<const float*>(t.data)), host.data() + host.tensors()[i].offset,
                          t.size * static_cast<int64_t>(sizeof(float)));
  }
  return ctx.backend->finish();
}

Status DeviceLora::upload(const Context& ctx, const LoraParams& host) {
  DC_RETURN_IF_ERROR(check_host(host, "DeviceLora::upload"));
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    const float* staged = device_copy(ctx, "lora.upload", host.data() + host.tensors()[i].offset, t.size);
    DC_RETURN_IF_ERROR(device_status(ctx));
    copy_floats(ctx, staged, t.size, t.data);
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  return Status();
}

}  // namespace dc
