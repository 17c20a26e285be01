// DeviceTraining (train/device_training.h): the trainers' weights, gradients, moments and optimizer step on a
// device, and the loss rows' lm_head and cross-entropy there.
#include "train/device_training.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/profiler.h"
#include "model/activations.h"
#include "model/kv_cache.h"
#include "ops/adamw.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "train/optimizer.h"

namespace dc::train {

void set_device_training_precision(const Context& ctx, MatmulPrecision* precision) {
  if (*precision == MatmulPrecision::kBF16)
    dc::log(LogLevel::kInfo, "training on " + ctx.backend->name() + ": f32 throughout (the device's backward has no "
                             "bf16 matrix-unit path yet)");
  *precision = MatmulPrecision::kF32;
}

DeviceLossRows::DeviceLossRows() = default;
DeviceLossRows::~DeviceLossRows() = default;
DeviceLossRows::DeviceLossRows(DeviceLossRows&&) noexcept = default;
DeviceLossRows& DeviceLossRows::operator=(DeviceLossRows&&) noexcept = default;

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

int64_t DeviceLossRows::default_chunk_rows(int64_t n_vocab) {
  const int64_t rows = kChunkLogitsBytes / (n_vocab * static_cast<int64_t>(sizeof(float)));
  return std::max<int64_t>(64, rows / 64 * 64);
}

int64_t DeviceLossRows::chunk_rows(const ModelConfig& config) const {
  return forced_chunk_rows_ > 0 ? forced_chunk_rows_ : default_chunk_rows(config.n_vocab);
}

Status DeviceLossRows::reserve(const Context& ctx, const ModelConfig& config, int64_t n_out) {
  const int64_t rows = std::max<int64_t>(n_out, 1), chunk = std::min(rows, chunk_rows(config)), E = config.n_embd;
  DC_RETURN_IF_ERROR(ensure(ctx, hidden_, hidden_floats_, rows * E, "the loss rows' hidden states"));
  DC_RETURN_IF_ERROR(ensure(ctx, chunk_hidden_, chunk_hidden_floats_, chunk * E, "a chunk of the loss rows' hidden"));
  DC_RETURN_IF_ERROR(ensure(ctx, chunk_dhidden_, chunk_dhidden_floats_, chunk * E, "a chunk of the loss rows' gradient"));
  return ensure(ctx, logits_, logits_floats_, chunk * config.n_vocab, "a chunk of the loss rows' logits");
}

float* DeviceLossRows::hidden() const { return as_operand(hidden_->data()); }

Status DeviceLossRows::head_and_cross_entropy(const Context& ctx, const Model& model, int64_t n_out, const int32_t* targets,
                                              const float* weights, const HeadGrad* backward, float* ce_host,
                                              float* loss_host, const std::function<Status()>& then) {
  const ModelConfig& c = model.config();
  const int64_t E = c.n_embd, V = c.n_vocab, chunk = std::min(n_out, chunk_rows(c));
  DC_CHECK(ctx.device != Device::kCpu, "DeviceLossRows: a device context");
  DC_CHECK(n_out > 0 && hidden_floats_ >= n_out * E && logits_floats_ >= chunk * V,
           "DeviceLossRows: reserve() the rows first");
  const int64_t n_chunks = (n_out + chunk - 1) / chunk;
  float* const rows = as_operand(chunk_hidden_->data());    // [chunk, E] the chunk's hidden rows
  float* const drows = as_operand(chunk_dhidden_->data());  // [chunk, E] their gradient
  float* const logits = as_operand(logits_->data());        // [chunk, V] the chunk's logits, then dlogits
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  // The rows' inputs (uploaded whole; the targets' int32 words copied as words) and what the chunks' own operands
  // are copied from and into: every op but the copies takes operands that start a buffer (ops/device.h).
  const auto* all_targets = reinterpret_cast<const float*>(device_copy(ctx, "train.targets", targets, n_out));
  const float* all_weights = device_copy(ctx, "train.loss_weights", weights, n_out);
  float* chunk_targets = device_floats(ctx, "train.chunk_targets", chunk);  // [chunk] int32 words
  float* chunk_weights = device_floats(ctx, "train.chunk_weights", chunk);
  float* chunk_loss = device_floats(ctx, "train.chunk_loss", 1);
  float* losses = device_floats(ctx, "train.chunk_losses", n_chunks);  // [n_chunks] each chunk's Σ weights·CE
  float* sum = device_floats(ctx, "train.loss", 1);
  float* chunk_ce = ce_host != nullptr ? device_floats(ctx, "train.chunk_ce", chunk) : nullptr;
  float* ce = ce_host != nullptr ? device_floats(ctx, "train.ce", n_out) : nullptr;
  DC_RETURN_IF_ERROR(device_status(ctx));
  for (int64_t i = 0; i < n_chunks; ++i) {
    const int64_t r0 = i * chunk, k = std::min(chunk, n_out - r0);
    copy_floats(ctx, hidden() + r0 * E, k * E, rows);
    copy_floats(ctx, all_targets + r0, k, chunk_targets);
    copy_floats(ctx, all_weights + r0, k, chunk_weights);
    model.lm_head(ctx, rows, k, logits, k);
    cross_entropy_rows(ctx, logits, reinterpret_cast<const int32_t*>(chunk_targets), chunk_weights, k, V,
                       backward != nullptr ? logits : nullptr, chunk_ce, chunk_loss);
    copy_floats(ctx, chunk_loss, 1, losses + i);
    if (ce != nullptr) copy_floats(ctx, chunk_ce, k, ce + r0);
    if (backward == nullptr) continue;
    model.lm_head_backward(ctx, rows, k, logits, drows, backward->dw, i == 0 ? backward->write : GradWrite::kAdd);
    copy_floats(ctx, drows, k * E, hidden() + r0 * E);  // the chunk's rows of hidden() are not read again
  }
  sum_floats(ctx, losses, n_chunks, sum);
  if (then) DC_RETURN_IF_ERROR(then());
  if (loss_host != nullptr) ctx.backend->copy_out("train.loss", as_device(static_cast<const float*>(sum)), loss_host, sizeof(float));
  if (ce_host != nullptr)
    ctx.backend->copy_out("train.ce", as_device(static_cast<const float*>(ce)), ce_host, n_out * static_cast<int64_t>(sizeof(float)));
  return ctx.backend->finish();
}

DeviceTraining::~DeviceTraining() {
  if (backend_ == nullptr) return;
  const std::unique_lock<std::mutex> lock = backend_->lock();
  for (const void* host : hosts_) backend_->drop_weight(host);
}

Status DeviceTraining::adopt(const Context& ctx, const Model& model, ModelSpans* spans) {
  backend_ = ctx.backend;
  std::vector<const void*> hosts;  // each tensor's host data, the backend's key of its copy (visit_tensors order)
  visit_tensors(config_, model.weights(), [&](const std::string&, const std::vector<int64_t>&, const WeightView* m,
                                              const VectorView* v) {
    hosts.push_back(m != nullptr ? m->data : static_cast<const void*>(v->data()));
  });
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    for (const void* host : hosts) ctx.backend->drop_weight(host);
  }
  hosts_.insert(hosts_.end(), hosts.begin(), hosts.end());  // dropped again on destruction, whatever happens next
  DC_RETURN_IF_ERROR(model.to_device(ctx));
  Status status;
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  size_t i = 0;
  visit_tensors(config_, *spans, [&](const std::string& name, const std::vector<int64_t>& shape, std::span<float>* m,
                                     std::span<float>* v) {
    const void* host = hosts[i++];
    if (!status.ok()) return;
    auto memory = ctx.backend->weight_memory(host, name);
    if (!memory.ok()) {
      status = memory.status();
      return;
    }
    const int64_t n = shape.size() == 2 ? shape[0] * shape[1] : shape[0];
    *(m != nullptr ? m : v) = std::span<float>(as_operand(*memory), static_cast<size_t>(n));
  });
  DC_RETURN_IF_ERROR(status);
  if (config_.tie_word_embeddings) spans->output = spans->tok_embd;
  return Status();
}

namespace {

// "12.3 MiB" (a tenth below 100 MiB, whole MiB above: a small device's sizes stay apart).
std::string mib(int64_t bytes) {
  const double m = static_cast<double>(bytes) / (1 << 20);
  char text[32];
  std::snprintf(text, sizeof(text), m < 100 ? "%.1f MiB" : "%.0f MiB", m);
  return text;
}

}  // namespace

std::string DeviceTrainingPlan::text() const {
  std::string t = "weights " + mib(weights) + ", gradients " + mib(gradients);
  if (moments > 0) t += ", Adam moments " + mib(moments);
  if (reference > 0) t += ", reference model " + mib(reference);
  t += ", activations " + mib(activations) + ", working buffers " + mib(scratch) + ", loss rows " + mib(loss_rows);
  if (rollouts > 0) t += ", rollouts " + mib(rollouts);
  return t + "; " + mib(total()) + " in all";
}

DeviceTrainingPlan plan_device_training(const Model& model, bool optimizer, bool reference, const DeviceBatchShape& batch,
                                        const LoraParams* lora, const DeviceShard* shard) {
  const ModelConfig& c = model.config();
  int64_t values = 0;
  visit_tensors(c, model.weights(), [&](const std::string&, const std::vector<int64_t>& shape, const WeightView*,
                                        const VectorView*) { values += shape.size() == 2 ? shape[0] * shape[1] : shape[0]; });
  constexpr int64_t kFloat = sizeof(float);
  const int64_t T = batch.positions, n_out = batch.loss_rows, E = c.n_embd, V = c.n_vocab;
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  DeviceTrainingPlan plan;
  plan.weights = plan.gradients = values * kFloat;
  plan.moments = optimizer ? 2 * plan.weights : 0;
  plan.reference = reference ? plan.weights : 0;
  if (shard != nullptr) {  // a rank's: the moments of its shard, and AdamW's copies of its parts of the edge tensors
    plan.moments = optimizer ? 2 * shard->values * kFloat : 0;
    plan.weights += shard->edge_values * kFloat;
  }
  int64_t lora_ranks = 0, lora_scratch = 0;  // Σ r of a layer's adapters; their products' buffers [T, ·]
  if (lora != nullptr) {  // a frozen base as stored; the adapters' gradients, moments and reference copy only
    const int64_t adapters = lora->n_values() * kFloat;
    plan.weights = model.device_weight_bytes() + adapters;
    plan.gradients = adapters;
    plan.moments = optimizer ? 2 * adapters : 0;
    plan.reference = reference ? adapters : 0;
    int64_t widest = 0;
    for (int t = 0; t < kLoraTargets; ++t)
      if (const LoraMatrix& m = lora->weights().layers[0][t]; !m.empty())
        lora_ranks += m.r, widest = std::max(widest, m.r);
    // lora.u, lora.su and lora.du [T, r], lora.sdy [T, out], with dropout lora.xd and lora.dxd [T, in]
    // (model/lora_project.cc)
    const int64_t widest_io = std::max({E, c.n_ff, q_dim});
    lora_scratch = T * (3 * widest + (lora->weights().dropout > 0 ? 3 : 1) * widest_io) * kFloat;
  }
  plan.activations = Activations::bytes_for(batch.recompute, c.n_layer, T, E, q_dim, kv_dim, c.n_ff, n_out, lora_ranks);
  // The forward's named buffers serve the training forward and the rollouts' alike: the larger of the two.
  plan.scratch = model.forward_bytes_per_position() * std::max(T, batch.rollout_positions) +
                 model.backward_bytes(T, n_out, batch.recompute, /*from_hidden=*/true) + lora_scratch;
  // DeviceLossRows: the rows' hidden states, one chunk's rows, their gradient and logits, and the words of the rows
  // (targets, weights, CE: 3 · n_out; a chunk's and the cross-entropy's per-row sums: 4 · chunk; one per chunk).
  const int64_t rows = std::max<int64_t>(n_out, 1), chunk = std::min(rows, DeviceLossRows::default_chunk_rows(V));
  plan.loss_rows = (rows * E + chunk * (2 * E + V) + 3 * rows + 4 * chunk + (rows + chunk - 1) / chunk + 2) * kFloat;
  // A rollout step's rows on the device (engine/device_head_sampler.cc), per sampled position: the forward's output
  // row and its gathered copy [E] each, its logits [V], and 7 words (the forward's out-row index; the head's row
  // index, uniform draw and id; 3 confidences).
  plan.rollouts = batch.rollout_sampled * ((2 * E + V) * kFloat + 7 * 4);
  if (batch.rollout_kv_rows > 0) plan.rollouts += KvCache::bytes_for(c.n_layer, batch.rollout_kv_rows, batch.rollout_kv_seq, kv_dim);
  return plan;
}

Status check_device_plan(const DeviceTrainingPlan& plan, const Model& model, bool optimizer, bool reference,
                         const DeviceBatchShape& batch, int64_t device_bytes, const std::string& device,
                         const LoraParams* lora, const DeviceShard* shard) {
  if (plan.total() <= device_bytes) return Status();
  std::string fixes;
  if (!batch.recompute) {
    DeviceBatchShape checkpointed = batch;
    checkpointed.recompute = true;
    const DeviceTrainingPlan with = plan_device_training(model, optimizer, reference, checkpointed, lora, shard);
    fixes += "--grad-checkpointing (activations " + mib(plan.activations) + " -> " + mib(with.activations) + ", " +
             mib(with.total()) + " in all" + (with.total() <= device_bytes ? ", which fits" : "") + "); ";
  }
  fixes += "fewer positions per micro-batch (" + batch.smaller_batch + "; the activations, working buffers and loss rows, " +
           mib(plan.activations + plan.scratch + plan.loss_rows) + ", shrink with them); ";
  if (optimizer && lora == nullptr)
    fixes += "more ranks (mpirun: each rank's device keeps the Adam moments of its shard only, " + mib(plan.moments) +
             " over the ranks here); ";
  if (lora == nullptr) fixes += "LoRA adapters (--lora-r: the base frozen, gradients and moments of the adapters only); ";
  fixes += "or --device cpu";
  return resource_exhausted("training on " + device + " needs " + plan.text() + ", more than its " + mib(device_bytes) +
                            ". What would make it fit: " + fixes);
}

Result<std::unique_ptr<DeviceTraining>> DeviceTraining::start(const Context& ctx, const Model& model, OptimizerCore* core,
                                                              const DeviceBatchShape& batch, bool reference) {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "DeviceTraining::start: a device context");
  std::unique_ptr<DeviceTraining> d(new DeviceTraining());
  d->config_ = model.config();
  d->sharded_ = core != nullptr && core->sharded();
  DeviceShard shard;
  if (d->sharded_) {
    d->parts_ = shard_parts(*core);
    shard.values = core->shard().size();
    for (const ShardPart& part : d->parts_) shard.edge_values += part.whole ? 0 : part.end - part.begin;
  }
  const bool optimizer = core != nullptr;
  const DeviceShard* sharded = d->sharded_ ? &shard : nullptr;
  const DeviceTrainingPlan plan = plan_device_training(model, optimizer, reference, batch, nullptr, sharded);
  dc::log(LogLevel::kInfo, "training on " + ctx.backend->name() + ": device memory " + plan.text() +
                               (d->sharded_ ? " (the Adam moments of this rank's shard)" : ""));
  DC_RETURN_IF_ERROR(check_device_plan(plan, model, optimizer, reference, batch, ctx.backend->memory_bytes(),
                                       ctx.backend->name(), nullptr, sharded));
  DC_RETURN_IF_ERROR(d->adopt(ctx, model, &d->params_));
  DC_ASSIGN_OR_RETURN(d->grads_, DeviceParams::zeros(ctx, d->config_));
  if (d->sharded_) {
    DC_RETURN_IF_ERROR(d->start_shard(ctx, *core));  // the core's gradient buffers given back first
    d->staging_ = ModelParams::zeros(d->config_);
    return d;
  }
  if (!optimizer) return d;
  d->moments_ = true;
  DC_ASSIGN_OR_RETURN(d->m_, DeviceParams::zeros(ctx, d->config_));
  DC_ASSIGN_OR_RETURN(d->v_, DeviceParams::zeros(ctx, d->config_));
  if (core->steps_done() > 0) {  // resumed: the saved moments
    DC_RETURN_IF_ERROR(d->m_.upload(ctx, core->m()));
    DC_RETURN_IF_ERROR(d->v_.upload(ctx, core->v()));
  }
  return d;
}

namespace {

// host[n] into the device operand `dst` through the staging buffer `name`, one submission (ctx.backend's lock held).
Status upload_floats(const Context& ctx, const char* name, const float* host, int64_t n, float* dst) {
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  const float* staged = device_copy(ctx, name, host, n);
  DC_RETURN_IF_ERROR(device_status(ctx));
  copy_floats(ctx, staged, n, dst);
  return ctx.backend->finish();
}

}  // namespace

std::vector<DeviceTraining::ShardPart> DeviceTraining::shard_parts(const OptimizerCore& core) {
  const dist::Range shard = core.shard();
  const AdamWOptions& o = core.options().adam;
  const std::vector<ModelParams::Tensor>& ts = core.params().tensors();
  std::vector<ShardPart> parts;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t lo = std::max(shard.begin, ts[i].offset), hi = std::min(shard.end, ts[i].offset + ts[i].size);
    if (lo >= hi) continue;
    const double wd = ts[i].is_matrix || o.decay_vectors ? o.weight_decay : 0.0;
    parts.push_back({i, lo, hi, hi - lo == ts[i].size, nullptr, nullptr, nullptr, wd});
  }
  return parts;
}

Status DeviceTraining::start_shard(const Context& ctx, OptimizerCore& core) {
  const OptimizerCore::ShardMoments moments = core.hand_state_to_device();  // zeros, or the resumed ones
  std::vector<std::span<float>> weights;  // the device copies, index order
  visit_tensors(config_, params_, [&](const std::string&, const std::vector<int64_t>&, const std::span<float>* m,
                                      const std::span<float>* v) { weights.push_back(m != nullptr ? *m : *v); });
  const int64_t base = core.shard().begin;
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  auto allocate = [&](int64_t n, const std::string& what) -> Result<float*> {
    DC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMemory> memory, ctx.backend->allocate(n * static_cast<int64_t>(sizeof(float)), what));
    shard_memory_.push_back(std::move(memory));
    return as_operand(shard_memory_.back()->data());
  };
  for (ShardPart& part : parts_) {
    const int64_t n = part.end - part.begin;
    const std::string name = core.params().tensors()[part.tensor].name;
    DC_ASSIGN_OR_RETURN(part.m, allocate(n, "the Adam moments of " + name));
    DC_ASSIGN_OR_RETURN(part.v, allocate(n, "the Adam moments of " + name));
    DC_RETURN_IF_ERROR(upload_floats(ctx, "optimizer.shard_upload", moments.m.data() + (part.begin - base), n, part.m));
    DC_RETURN_IF_ERROR(upload_floats(ctx, "optimizer.shard_upload", moments.v.data() + (part.begin - base), n, part.v));
    if (part.whole) {
      part.p = weights[part.tensor].data();
    } else {
      DC_ASSIGN_OR_RETURN(part.p, allocate(n, "this rank's part of " + name));
      DC_RETURN_IF_ERROR(upload_floats(ctx, "optimizer.shard_upload", core.params().data() + part.begin, n, part.p));
    }
  }
  return Status();
}

Status DeviceTraining::update_shard(const Context& ctx, OptimizerCore& core, const float* g, float grad_scale, double lr) {
  const AdamWOptions& o = core.options().adam;
  const int64_t base = core.shard().begin, t = core.steps_done() + 1;
  float* host = core.host_state().params.data();
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  for (const ShardPart& part : parts_) {
    const int64_t n = part.end - part.begin;
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    const float* g_part = device_copy(ctx, "optimizer.shard_grads", g + (part.begin - base), n);
    DC_RETURN_IF_ERROR(device_status(ctx));
    adamw_update(ctx, adamw_scalars(t, lr, o.beta1, o.beta2, o.eps, part.weight_decay, grad_scale), part.p, g_part,
                 part.m, part.v, n);
    ctx.backend->copy_out("optimizer.shard_weights", as_device(static_cast<const float*>(part.p)), host + part.begin,
                          n * static_cast<int64_t>(sizeof(float)));
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  return Status();
}

Result<OptimizerStepStats> DeviceTraining::step_sharded(const Context& ctx, OptimizerCore& core, double loss) {
  {
    const ProfileScope profile(ctx, "gradients to the host");
    DC_RETURN_IF_ERROR(grads_.download(ctx, staging_));
  }
  OptimizerStepStats s = core.step_local_grads(ctx, staging_.data(), loss, [&](const float* g, float grad_scale, double lr) {
    const ProfileScope profile(ctx, "AdamW of the shard on the device");
    return update_shard(ctx, core, g, grad_scale, lr);
  });
  if (s.skipped) return s;  // the weights stay: nothing to upload
  const ProfileScope profile(ctx, "weights to the device");
  DC_RETURN_IF_ERROR(upload_into(ctx, params_, core.params()));
  return s;
}

Result<OptimizerStepStats> device_adamw_step(const Context& ctx, const std::vector<DeviceAdamwTensor>& tensors,
                                             const OptimizerOptions& options, int64_t steps_done, double loss) {
  const int64_t n = static_cast<int64_t>(tensors.size());
  const AdamWOptions& o = options.adam;
  OptimizerStepStats s;
  s.lr = learning_rate(options.lr, steps_done);
  const auto max_norm = static_cast<float>(options.max_grad_norm);
  float sumsq_host = 0;  // the metric, read back once the step has run
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    float* sums = device_floats(ctx, "optimizer.tensor_sumsq", n);  // [n] each tensor's Σ g²
    float* sumsq = device_floats(ctx, "optimizer.sumsq", 1);        // [1] Σ over every gradient: the norm's square
    DC_RETURN_IF_ERROR(device_status(ctx));
    for (int64_t i = 0; i < n; ++i) squared_norm(ctx, tensors[i].g, tensors[i].n, sums, i);
    sum_floats(ctx, sums, n, sumsq);
    if (std::isfinite(loss))  // a non-finite norm skips the update on the device itself (adamw_update's clip_sumsq)
      for (const DeviceAdamwTensor& x : tensors)
        adamw_update(ctx, adamw_scalars(steps_done + 1, s.lr, o.beta1, o.beta2, o.eps, x.weight_decay), x.p, x.g, x.m,
                     x.v, x.n, sumsq, max_norm);
    ctx.backend->copy_out("optimizer.sumsq", as_device(static_cast<const float*>(sumsq)), &sumsq_host, sizeof(float));
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  s.grad_norm = std::sqrt(static_cast<double>(sumsq_host));
  s.skip_cause = skip_cause(loss, s.grad_norm);  // what the device decided: the same Σ, the same rule
  return s;
}

Result<OptimizerStepStats> DeviceTraining::step(const Context& ctx, OptimizerCore& core, double loss) {
  DC_CHECK(core.sharded() == sharded_ && (moments_ || sharded_), "DeviceTraining::step: started with this optimizer");
  if (sharded_) return step_sharded(ctx, core, loss);
  const std::vector<DeviceParams::Tensor>& grads = grads_.tensors();
  const AdamWOptions& o = core.options().adam;
  std::vector<DeviceAdamwTensor> tensors;
  visit_tensors(config_, params_, [&](const std::string&, const std::vector<int64_t>&, std::span<float>* m,
                                      std::span<float>* v) {
    const std::span<float>& p = m != nullptr ? *m : *v;
    const size_t i = tensors.size();
    const double wd = m != nullptr || o.decay_vectors ? o.weight_decay : 0.0;  // as adamw_step's
    tensors.push_back({p.data(), grads[i].data.data(), m_.tensors()[i].data.data(), v_.tensors()[i].data.data(),
                       static_cast<int64_t>(p.size()), wd});
  });
  DC_ASSIGN_OR_RETURN(OptimizerStepStats s, device_adamw_step(ctx, tensors, core.options(), core.steps_done(), loss));
  return core.count_step(std::move(s));
}

Status DeviceTraining::sync_to_host(const Context& ctx, OptimizerCore& core) const {
  if (sharded_) return download_shard_moments(ctx, core);  // the core's weights are the device's already
  if (moments_) {
    DC_RETURN_IF_ERROR(m_.download(ctx, core.host_state().m));
    DC_RETURN_IF_ERROR(v_.download(ctx, core.host_state().v));
  }
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

Status DeviceTraining::download_shard_moments(const Context& ctx, OptimizerCore& core) const {
  const int64_t base = core.shard().begin;
  OptimizerCore::ShardMoments moments;
  moments.m.resize(static_cast<size_t>(core.shard().size()));
  moments.v.resize(moments.m.size());
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  for (const ShardPart& part : parts_) {
    const int64_t bytes = (part.end - part.begin) * static_cast<int64_t>(sizeof(float));
    DC_RETURN_IF_ERROR(ctx.backend->begin());
    ctx.backend->copy_out("optimizer.shard_m", as_device(static_cast<const float*>(part.m)), moments.m.data() + (part.begin - base), bytes);
    ctx.backend->copy_out("optimizer.shard_v", as_device(static_cast<const float*>(part.v)), moments.v.data() + (part.begin - base), bytes);
    DC_RETURN_IF_ERROR(ctx.backend->finish());
  }
  core.restore_shard_moments(std::move(moments));
  return Status();
}

Status DeviceTraining::upload_reference(const Context& ctx, const Model& reference) {
  DC_CHECK(reference.config().n_embd == config_.n_embd && reference.config().n_layer == config_.n_layer,
           "DeviceTraining::upload_reference: a model of the trainer's config");
  return adopt(ctx, reference, &reference_);
}

Status DeviceTraining::refresh_reference(const Context& ctx, const ModelParams& host) const {
  if (reference_.tok_embd.empty()) return invalid_argument("refresh_reference: the reference model was never uploaded");
  return upload_into(ctx, reference_, host);
}

Status DeviceTraining::upload_into(const Context& ctx, const ModelSpans& device, const ModelParams& host) const {
  std::vector<std::span<float>> spans;  // the device copies, index order
  visit_tensors(config_, device, [&](const std::string&, const std::vector<int64_t>&, const std::span<float>* m,
                                     const std::span<float>* v) { spans.push_back(m != nullptr ? *m : *v); });
  DC_CHECK(spans.size() == host.tensors().size(), "DeviceTraining::upload_into: a ModelParams of the trainer's config");
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  for (size_t i = 0; i < spans.size(); ++i) {
    const ModelParams::Tensor& t = host.tensors()[i];
    DC_CHECK(static_cast<int64_t>(spans[i].size()) == t.size, "DeviceTraining::upload_into: a ModelParams of the trainer's config");
    DC_RETURN_IF_ERROR(upload_floats(ctx, "params.upload", t.data, t.size, spans[i].data()));
  }
  return Status();
}

}  // namespace dc::train
