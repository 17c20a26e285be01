// LoraCore: the adapters' optimizer state, step and PEFT checkpoints (train/lora_core.h).
#include "train/lora_core.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/check.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"
#include "ops/matmul.h"
#include "train/optimizer.h"

namespace dc::train {
namespace fs = std::filesystem;

ModelWeights pack_frozen_base(const Context& ctx, Model& model) {
  ModelWeights t;
  t.layers.resize(static_cast<size_t>(model.config().n_layer));
  if (ctx.matmul_precision != MatmulPrecision::kBF16 || !model.pack_weights(ctx).ok()) return t;
  auto transposed = [](const WeightView& v) {
    return !v.quantized() && v.layout == WeightLayout::kPanels ? transposed_panels(v) : WeightView{};
  };
  const ModelWeights& w = model.weights();
  for (size_t il = 0; il < w.layers.size(); ++il)
    for (WeightView LayerWeights::*m : {&LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv, &LayerWeights::wo,
                                        &LayerWeights::w_gate, &LayerWeights::w_up, &LayerWeights::w_down})
      t.layers[il].*m = transposed(w.layers[il].*m);
  t.output = transposed(w.output);
  return t;
}

std::string lora_fingerprint(const LoraSpec& s) {
  if (s.r <= 0) return "";
  std::ostringstream os;
  os.precision(17);
  os << " lora_r=" << s.r << " lora_alpha=" << s.alpha << " lora_targets=" << lora_targets_text(s.targets)
     << " lora_dropout=" << s.dropout << " rslora=" << s.use_rslora;
  return os.str();
}

Status check_checkpoint_kind(const std::string& latest, bool lora) {
  if (latest.empty() || fs::exists(fs::path(latest) / "adapter_config.json") == lora) return Status();
  return invalid_argument("--resume: " + latest +
                          (lora ? " is a full fine-tune's checkpoint, not a LoRA run's (drop --lora-r)"
                                : " is a LoRA run's checkpoint (pass its --lora-r and --lora-* flags)"));
}

LoraCore LoraCore::start(const ModelConfig& config, const LoraSpec& spec, uint64_t seed, const OptimizerOptions& options,
                         dist::Comm* comm) {
  LoraCore c;
  c.options_ = options;
  c.comm_ = comm;
  c.params_ = LoraParams::zeros(config, spec);
  c.params_.init_peft(seed);
  c.grads_ = LoraParams::zeros_like(c.params_);
  c.m_ = LoraParams::zeros_like(c.params_);
  c.v_ = LoraParams::zeros_like(c.params_);
  c.state_.seed = seed;
  return c;
}

Result<LoraCore> LoraCore::resume(const std::string& dir, const ModelConfig& config, const OptimizerOptions& options,
                                  dist::Comm* comm) {
  LoraCore c;
  c.options_ = options;
  c.comm_ = comm;
  int shards = 1;
  DC_RETURN_IF_ERROR(load_train_state(dir, c.state_, &shards));
  DC_ASSIGN_OR_RETURN(const LoraAdapter adapter, open_lora_adapter(dir));
  DC_ASSIGN_OR_RETURN(c.params_, LoraParams::from_adapter(adapter, config));
  c.params_.set_dropout(static_cast<float>(adapter.config.lora_dropout));
  c.grads_ = LoraParams::zeros_like(c.params_);
  c.m_ = LoraParams::zeros_like(c.params_);
  c.v_ = LoraParams::zeros_like(c.params_);
  const std::string path = (fs::path(dir) / "optimizer.safetensors").string();
  DC_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::open(path));
  for (const LoraParams::Tensor& t : c.params_.tensors())
    for (const auto& [prefix, into] : {std::pair<const char*, LoraParams*>{"m.", &c.m_}, {"v.", &c.v_}}) {
      const TensorInfo* info = file.find(prefix + t.name);
      if (info == nullptr) return invalid_argument(path + ": no tensor " + prefix + t.name + " (not this adapter's moments)");
      if (info->dtype != DType::kF32 || info->shape != t.shape)
        return invalid_argument(path + ": " + prefix + t.name + " is not f32 of the adapter's shape");
      float* out = into->data() + t.offset;
      std::memcpy(out, info->data, static_cast<size_t>(t.size) * sizeof(float));
      for (int64_t i = 0; i < t.size; ++i)
        if (!std::isfinite(out[i]) || (into == &c.v_ && out[i] < 0))
          return invalid_argument(path + ": " + prefix + t.name + " holds " + std::to_string(out[i]) + " at index " +
                                  std::to_string(i) + " (moments must be finite, v >= 0)");
    }
  return c;
}

OptimizerStepStats LoraCore::step(const Context& ctx, double loss, const AdapterUpdate& update) {
  OptimizerStepStats s;
  s.lr = learning_rate(options_.lr, state_.step);
  const int64_t n = params_.n_values();
  float* g = grads_.data();
  DC_CHECK(!update || data_parallel(), "LoraCore::step: an update elsewhere over ranks only");
  auto fail = [&](const Status& st) { comm_->abort(1, "optimizer step " + std::to_string(state_.step + 1) + ": " + st.message()); };
  if (data_parallel()) {  // the ranks' sum, in rank order, on every rank
    const dist::Range shard = dist::shard_range(n, comm_->rank(), comm_->size());
    std::vector<float> sum(static_cast<size_t>(shard.size()), 0.0f);
    Status st = comm_->reduce_scatter_add(g, {0, n}, n, sum.data());
    if (st.ok()) {
      std::copy(sum.begin(), sum.end(), g + shard.begin);
      st = comm_->all_gather(g, n);
    }
    if (!st.ok()) fail(st);
  }
  s.grad_norm = std::sqrt(sum_of_squares(g, n, ctx.pool));
  s.skip_cause = skip_cause(loss, s.grad_norm);
  if (s.skip_cause.empty()) {
    const float clip = clip_coefficient(s.grad_norm, options_.max_grad_norm);
    if (update) {
      if (const Status st = update(clip, s.lr); !st.ok()) fail(st);
      return count_step(std::move(s));
    }
    if (clip != 1.0f)
      for (int64_t i = 0; i < n; ++i) g[i] *= clip;
    const AdamWOptions& a = options_.adam;
    adamw_update(params_.data(), g, m_.data(), v_.data(), n, state_.step + 1, s.lr, a.beta1, a.beta2, a.eps,
                 a.weight_decay);
  }
  return count_step(std::move(s));
}

OptimizerStepStats LoraCore::count_step(OptimizerStepStats s) {
  s.skipped = !s.skip_cause.empty();
  if (s.skipped) ++consecutive_skips_, ++state_.skipped_steps;
  else consecutive_skips_ = 0;
  s.step = ++state_.step;
  return s;
}

Result<std::string> LoraCore::save(const std::string& out_dir, const std::string& base_model,
                                   const ExtraCheckpointFiles& extra) {
  const std::string dir = (fs::path(out_dir) / checkpoint_name(state_.step)).string();
  Status st;
  if (comm_ == nullptr || comm_->rank() == 0)
    st = write_dir_atomically(dir, /*replace=*/true, [&](const std::string& tmp) {
      DC_RETURN_IF_ERROR(params_.save_peft(tmp, base_model));
      std::vector<TensorToWrite> moments;
      for (const LoraParams::Tensor& t : params_.tensors()) {
        moments.push_back({"m." + t.name, DType::kF32, t.shape, m_.data() + t.offset});
        moments.push_back({"v." + t.name, DType::kF32, t.shape, v_.data() + t.offset});
      }
      DC_RETURN_IF_ERROR(write_safetensors((fs::path(tmp) / "optimizer.safetensors").string(), moments));
      DC_RETURN_IF_ERROR(write_train_state(tmp, state_));
      return extra ? extra(tmp) : Status();
    });
  if (comm_ != nullptr && comm_->size() > 1) {  // every rank returns rank 0's outcome
    double failed = st.ok() ? 0.0 : 1.0;
    DC_RETURN_IF_ERROR(comm_->broadcast(&failed, sizeof(failed), 0));
    if (failed != 0.0 && st.ok()) return io_error("rank 0 failed to write " + dir);
  }
  DC_RETURN_IF_ERROR(st);
  return dir;
}

Result<std::vector<std::string>> LoraCore::open_metrics(const std::string& out_dir) {
  if (comm_ != nullptr && comm_->rank() != 0) return std::vector<std::string>{};
  return open_metrics_file(out_dir, state_.step, &metrics_path_);
}

Status LoraCore::append_metrics(const std::string& json_object) const {
  if (metrics_path_.empty()) return Status();
  return append_text_file(metrics_path_, json_object + "\n");
}

}  // namespace dc::train
