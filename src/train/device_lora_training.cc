// DeviceLoraTraining (train/device_lora_training.h): a LoRA run's adapters, gradients, moments and optimizer step
// on a device.
#include "train/device_lora_training.h"

#include <cmath>

#include "core/log.h"
#include "core/profiler.h"
#include "ops/adamw.h"
#include "ops/device.h"
#include "train/optimizer.h"

namespace dc::train {

Result<std::unique_ptr<DeviceLoraTraining>> DeviceLoraTraining::start(const Context& ctx, const Model& base,
                                                                      const LoraCore& core, const DeviceBatchShape& batch,
                                                                      const LoraParams* reference) {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "DeviceLoraTraining::start: a device context");
  const LoraParams& adapters = core.params();
  const bool ref = reference != nullptr;
  const DeviceTrainingPlan plan = plan_device_training(base, /*optimizer=*/true, ref, batch, &adapters);
  dc::log(LogLevel::kInfo, "training LoRA adapters on " + ctx.backend->name() + ": device memory " + plan.text());
  DC_RETURN_IF_ERROR(check_device_plan(plan, base, true, ref, batch, ctx.backend->memory_bytes(), ctx.backend->name(),
                                       &adapters));
  std::unique_ptr<DeviceLoraTraining> d(new DeviceLoraTraining());
  d->backend_ = ctx.backend;
  visit_tensors(base.config(), base.weights(), [&](const std::string&, const std::vector<int64_t>&, const WeightView* m,
                                                   const VectorView* v) {
    d->hosts_.push_back(m != nullptr ? m->data : static_cast<const void*>(v->data()));
  });
  for (const LoraParams* p : {&adapters, reference})
    if (p != nullptr)
      for (const LoraParams::Tensor& t : p->tensors()) d->hosts_.push_back(p->data() + t.offset);
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    for (const void* host : d->hosts_) ctx.backend->drop_weight(host);
  }
  DC_RETURN_IF_ERROR(base.to_device(ctx));
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(base.lora_to_device(ctx, adapters.weights()));
    if (ref) DC_RETURN_IF_ERROR(base.lora_to_device(ctx, reference->weights()));
    for (const LoraParams::Tensor& t : adapters.tensors()) {
      DC_ASSIGN_OR_RETURN(const DevicePtr<float> p, ctx.backend->weight_memory(adapters.data() + t.offset, t.name));
      d->params_.push_back(as_operand(p));
    }
  }
  DC_ASSIGN_OR_RETURN(d->grads_, DeviceLora::zeros_like(ctx, adapters));
  DC_ASSIGN_OR_RETURN(d->m_, DeviceLora::zeros_like(ctx, adapters));
  DC_ASSIGN_OR_RETURN(d->v_, DeviceLora::zeros_like(ctx, adapters));
  if (core.steps_done() > 0) {  // resumed: the saved moments (the adapters came with the upload)
    DC_RETURN_IF_ERROR(d->m_.upload(ctx, core.m()));
    DC_RETURN_IF_ERROR(d->v_.upload(ctx, core.v()));
  }
  return d;
}

Status DeviceLoraTraining::refresh_reference(const Context& ctx, const Model& base, const LoraParams& reference) const {
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  for (const LoraParams::Tensor& t : reference.tensors()) ctx.backend->drop_weight(reference.data() + t.offset);
  return base.lora_to_device(ctx, reference.weights());
}

DeviceLoraTraining::~DeviceLoraTraining() {
  if (backend_ == nullptr) return;
  const std::unique_lock<std::mutex> lock = backend_->lock();
  for (const void* host : hosts_) backend_->drop_weight(host);
}

Result<OptimizerStepStats> DeviceLoraTraining::step(const Context& ctx, LoraCore& core, double loss) {
  std::vector<DeviceAdamwTensor> tensors;
  for (size_t i = 0; i < params_.size(); ++i)  // every adapter tensor a matrix: decayed, as LoraCore::step's
    tensors.push_back({params_[i], grads_.tensors()[i].data, m_.tensors()[i].data, v_.tensors()[i].data,
                       grads_.tensors()[i].size, core.options().adam.weight_decay});
  if (core.data_parallel()) {
    {
      const ProfileScope profile(ctx, "adapters' gradients to the host");
      DC_RETURN_IF_ERROR(grads_.download(ctx, core.grads()));
    }
    return core.step(ctx, loss, [&](float grad_scale, double lr) -> Status {
      const ProfileScope profile(ctx, "AdamW of the adapters on the device");
      DC_RETURN_IF_ERROR(grads_.upload(ctx, core.grads()));  // the ranks' sum
      const AdamWOptions& o = core.options().adam;
      const std::unique_lock<std::mutex> lock = ctx.backend->lock();
      DC_RETURN_IF_ERROR(ctx.backend->begin());
      for (const DeviceAdamwTensor& x : tensors)
        adamw_update(ctx, adamw_scalars(core.steps_done() + 1, lr, o.beta1, o.beta2, o.eps, x.weight_decay, grad_scale),
                     x.p, x.g, x.m, x.v, x.n);
      return ctx.backend->finish();
    });
  }
  DC_ASSIGN_OR_RETURN(OptimizerStepStats s, device_adamw_step(ctx, tensors, core.options(), core.steps_done(), loss));
  return core.count_step(std::move(s));
}

Status DeviceLoraTraining::sync_to_host(const Context& ctx, LoraCore& core) const {
  LoraCore::HostState host = core.host_state();
  DC_RETURN_IF_ERROR(m_.download(ctx, host.m));
  DC_RETURN_IF_ERROR(v_.download(ctx, host.v));
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  for (size_t i = 0; i < params_.size(); ++i) {
    const LoraParams::Tensor& t = host.params.tensors()[i];
    ctx.backend->copy_out(t.name.c_str(), as_device(static_cast<const float*>(params_[i])), host.params.data() + t.offset,
                          t.size * static_cast<int64_t>(sizeof(float)));
  }
  return ctx.backend->finish();
}

}  // namespace dc::train
