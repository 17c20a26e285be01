// DeviceParams (model/device_params.h): one DeviceMemory per tensor, zeroed and downloaded through the
// backend's ops in one submission each.
#include "model/device_params.h"

#include <string>

#include "ops/device.h"
#include "ops/elementwise.h"

namespace dc {

DeviceParams::DeviceParams() = default;
DeviceParams::~DeviceParams() = default;
DeviceParams::DeviceParams(DeviceParams&&) noexcept = default;
DeviceParams& DeviceParams::operator=(DeviceParams&&) noexcept = default;

Result<DeviceParams> DeviceParams::zeros(const Context& ctx, const ModelConfig& config) {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "DeviceParams::zeros: a device context");
  DeviceParams p;
  p.config_ = config;
  Status status;
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    visit_tensors(config, p.spans_, [&](const std::string& name, const std::vector<int64_t>& shape, std::span<float>* m,
                                        std::span<float>* v) {
      int64_t size = 1;
      for (int64_t d : shape) size *= d;
      if (!status.ok()) return;
      auto memory = ctx.backend->allocate(size * static_cast<int64_t>(sizeof(float)), "the tensor " + name);
      if (!memory.ok()) {
        status = memory.status();
        return;
      }
      *(m != nullptr ? m : v) = std::span<float>(as_operand((*memory)->data()), static_cast<size_t>(size));
      p.tensors_.push_back({name, *(m != nullptr ? m : v)});
      p.memory_.push_back(std::move(memory).value());
    });
  }
  DC_RETURN_IF_ERROR(status);
  if (config.tie_word_embeddings) p.spans_.output = p.spans_.tok_embd;
  DC_RETURN_IF_ERROR(p.zero(ctx));
  return p;
}

Status DeviceParams::zero(const Context& ctx) {
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  for (const Tensor& t : tensors_) zero_fill(ctx, t.data.data(), static_cast<int64_t>(t.data.size()));
  return ctx.backend->finish();
}

Status DeviceParams::check_host(const ModelParams& host, const char* what) const {
  const std::vector<ModelParams::Tensor>& h = host.tensors();
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (i >= h.size() || h[i].name != tensors_[i].name || h[i].size != static_cast<int64_t>(tensors_[i].data.size()))
      return invalid_argument(std::string(what) + ": the host parameters are not shaped like " + tensors_[i].name);
  if (h.size() != tensors_.size()) return invalid_argument(std::string(what) + ": the host parameters have more tensors");
  return Status();
}

Status DeviceParams::download(const Context& ctx, ModelParams& host) const {
  DC_RETURN_IF_ERROR(check_host(host, "DeviceParams::download"));
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    ctx.backend->copy_out(t.name.c_str(), as_device(static_cast<const float*>(t.data.data())), host.tensors()[i].data,
                          static_cast<int64_t>(t.data.size() * sizeof(float)));
  }
  return ctx.backend->finish();
}

Status DeviceParams::upload(const Context& ctx, const ModelParams& host) {
  DC_RETURN_IF_ERROR(check_host(host, "DeviceParams::upload"));
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    const int64_t n = static_cast<int64_t>(t.data.size());
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    const float* staged = device_copy(ctx, "params.upload", static_cast<const float*>(host.tensors()[i].data), n);
    DC_RETURN_IF_ERROR(device_status(ctx));
    copy_floats(ctx, staged, n, t.data.data());
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  return Status();
}

}  // namespace dc
