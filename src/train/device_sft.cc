// DeviceSft (train/device_sft.h): the SFT step's loss, backward and optimizer on a device.
#include "train/device_sft.h"

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "ops/adamw.h"
#include "ops/device.h"
#include "ops/loss.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace dc::train {

DeviceSft::~DeviceSft() = default;

Result<std::unique_ptr<DeviceSft>> DeviceSft::start(const Context& ctx, const Model& model, const OptimizerCore& core) {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "DeviceSft::start: a device context");
  std::unique_ptr<DeviceSft> d(new DeviceSft());
  d->config_ = core.config();
  DC_RETURN_IF_ERROR(model.to_device(ctx));
  Status status;
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    visit_tensors(d->config_, d->params_, [&](const std::string& name, const std::vector<int64_t>&, std::span<float>* m,
                                              std::span<float>* v) {
      if (!status.ok()) return;
      const ModelParams::Tensor* host = core.params().find(name);
      DC_CHECK(host != nullptr, "DeviceSft::start: a tensor of the config missing from the weights");
      auto memory = ctx.backend->weight_memory(host->data, name);
      if (!memory.ok()) {
        status = memory.status();
        return;
      }
      *(m != nullptr ? m : v) = std::span<float>(as_operand(*memory), static_cast<size_t>(host->size));
    });
  }
  DC_RETURN_IF_ERROR(status);
  if (d->config_.tie_word_embeddings) d->params_.output = d->params_.tok_embd;
  DC_ASSIGN_OR_RETURN(d->grads_, DeviceParams::zeros(ctx, d->config_));
  DC_ASSIGN_OR_RETURN(d->m_, DeviceParams::zeros(ctx, d->config_));
  DC_ASSIGN_OR_RETURN(d->v_, DeviceParams::zeros(ctx, d->config_));
  if (core.steps_done() > 0) {  // resumed: the saved moments
    DC_RETURN_IF_ERROR(d->m_.upload(ctx, core.m()));
    DC_RETURN_IF_ERROR(d->v_.upload(ctx, core.v()));
  }
  return d;
}

namespace {

// *memory of at least n floats (grown, never shrunk), allocated under ctx.backend's lock.
Status ensure(const Context& ctx, std::unique_ptr<DeviceMemory>& memory, int64_t& floats, int64_t n, const char* what) {
  if (floats >= n) return Status();
  memory.reset(), floats = 0;
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_ASSIGN_OR_RETURN(memory, ctx.backend->allocate(n * static_cast<int64_t>(sizeof(float)), what));
  floats = n;
  return Status();
}

}  // namespace

Result<double> DeviceSft::loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                                         Activations& acts, GradWrite write, LossTimes* times) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n_out = static_cast<int64_t>(batch.out_rows.size()), V = config_.n_vocab, E = config_.n_embd;
  ForwardBatch fb;
  fb.n_batch = batch.n_batch, fb.n_seq = batch.n_seq, fb.tokens = batch.tokens.data();
  fb.valid = batch.valid.empty() ? nullptr : batch.valid.data();
  fb.positions = batch.positions.empty() ? nullptr : batch.positions.data();
  fb.out_rows = batch.out_rows.data(), fb.n_out = n_out;
  DC_RETURN_IF_ERROR(ensure(ctx, hidden_, hidden_floats_, std::max<int64_t>(n_out, 1) * E, "the loss rows' hidden states"));
  DC_RETURN_IF_ERROR(ensure(ctx, logits_, logits_floats_, std::max<int64_t>(n_out, 1) * V, "the loss rows' logits"));
  float* hidden = as_operand(hidden_->data());  // [n_out, E]
  float* logits = as_operand(logits_->data());  // [n_out, V], becomes dlogits
  DC_RETURN_IF_ERROR(model.forward_hidden(ctx, fb, hidden, &acts));
  if (n_out == 0) {  // no loss rows: nothing to add, zeros to write
    if (write == GradWrite::kOverwrite) DC_RETURN_IF_ERROR(grads_.zero(ctx));
    return 0.0;
  }
  std::vector<float> weights(batch.weights);  // the gradients' scale in the loss weights: dlogits come out scaled
  for (float& w : weights) w *= grad_scale;
  float loss = 0;
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    const int32_t* targets = device_copy(ctx, "train.targets", batch.targets.data(), n_out);
    const float* loss_weights = device_copy(ctx, "train.loss_weights", weights.data(), n_out);
    float* sum = device_floats(ctx, "train.loss", 1);
    DC_RETURN_IF_ERROR(device_status(ctx));
    model.lm_head(ctx, hidden, n_out, logits, n_out);
    cross_entropy_rows(ctx, logits, targets, loss_weights, n_out, V, logits, nullptr, sum);
    ctx.backend->copy_out("train.loss", as_device(static_cast<const float*>(sum)), &loss, sizeof(float));
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  const auto t1 = std::chrono::steady_clock::now();
  DC_RETURN_IF_ERROR(model.backward(ctx, acts, logits, grads_.spans(), nullptr, write));
  if (times != nullptr) {
    times->forward_s = std::chrono::duration<double>(t1 - t0).count();
    times->backward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  return static_cast<double>(loss) / grad_scale;
}

Result<OptimizerStepStats> DeviceSft::step(const Context& ctx, OptimizerCore& core, double loss) {
  DC_CHECK(!core.sharded(), "DeviceSft::step: one process");
  const std::vector<DeviceParams::Tensor>& grads = grads_.tensors();
  const size_t n = grads.size();
  OptimizerStepStats s;
  s.lr = learning_rate(core.options().lr, core.steps_done());
  std::vector<float> sums(n);  // each tensor's Σ g² (the metric the norm is made of)
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    std::vector<std::string> names(n);
    for (size_t i = 0; i < n; ++i) {
      names[i] = "optimizer.sumsq." + std::to_string(i);
      float* part = device_floats(ctx, names[i].c_str(), 1);
      DC_RETURN_IF_ERROR(device_status(ctx));
      squared_norm(ctx, grads[i].data.data(), static_cast<int64_t>(grads[i].data.size()), part);
      ctx.backend->copy_out(names[i].c_str(), as_device(static_cast<const float*>(part)), &sums[i], sizeof(float));
    }
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  double sumsq = 0;
  for (float x : sums) sumsq += x;
  s.grad_norm = std::sqrt(sumsq);
  s.skip_cause = skip_cause(loss, s.grad_norm);
  if (s.skip_cause.empty()) {
    const AdamWOptions& o = core.options().adam;
    const float coefficient = clip_coefficient(s.grad_norm, core.options().max_grad_norm);
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    size_t i = 0;
    visit_tensors(config_, params_, [&](const std::string&, const std::vector<int64_t>&, std::span<float>* m,
                                        std::span<float>* v) {
      const std::span<float>& p = m != nullptr ? *m : *v;
      const double wd = m != nullptr || o.decay_vectors ? o.weight_decay : 0.0;  // as adamw_step's
      const AdamWStep scalars = adamw_scalars(core.steps_done() + 1, s.lr, o.beta1, o.beta2, o.eps, wd, coefficient);
      adamw_update(ctx, scalars, p.data(), grads[i].data.data(), m_.tensors()[i].data.data(), v_.tensors()[i].data.data(),
                   static_cast<int64_t>(p.size()));
      ++i;
    });
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  return core.count_step(std::move(s));
}

Status DeviceSft::sync_to_host(const Context& ctx, OptimizerCore& core) const {
  DC_RETURN_IF_ERROR(m_.download(ctx, core.host_state().m));
  DC_RETURN_IF_ERROR(v_.download(ctx, core.host_state().v));
  // The weights: a DeviceParams-like download of params_ into the master weights.
  ModelParams& host = core.host_state().params;
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  size_t i = 0;
  visit_tensors(config_, params_, [&](const std::string& name, const std::vector<int64_t>&, const std::span<float>* m,
                                      const std::span<float>* v) {
    const std::span<float>& p = m != nullptr ? *m : *v;
    ctx.backend->copy_out(name.c_str(), as_device(static_cast<const float*>(p.data())), host.tensors()[i++].data,
                          static_cast<int64_t>(p.size() * sizeof(float)));
  });
  return ctx.backend->finish();
}

}  // namespace dc::train
