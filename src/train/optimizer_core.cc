// OptimizerCore: start / resume, the optimizer step, checkpoints and metrics.jsonl.
#include "train/optimizer_core.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/profiler.h"
#include "io/atomic_dir.h"
#include "io/checkpoint.h"

namespace dc::train {
namespace fs = std::filesystem;

OptimizerCore OptimizerCore::start(const ModelConfig& config, ModelParams params, const OptimizerOptions& options,
                                   dist::Comm* comm) {
  OptimizerCore c;
  c.config_ = config;
  c.options_ = options;
  c.params_ = std::move(params);
  c.comm_ = comm;
  if (c.sharded()) {
    c.grads_ = ModelParams::zeros_sharing_layers(config);
    c.shard_ = dist::shard_range(c.params_.n_values(), comm->rank(), comm->size());
    c.m_shard_.assign(static_cast<size_t>(c.shard_.size()), 0.0f);
    c.v_shard_.assign(static_cast<size_t>(c.shard_.size()), 0.0f);
    c.g_shard_.assign(static_cast<size_t>(c.shard_.size()), 0.0f);
    const ModelParams::Tensor& first = *c.params_.find("model.layers.0.input_layernorm.weight");
    const ModelParams::Tensor& norm = *c.params_.find("model.norm.weight");  // the first tensor after the layers
    c.layers_ = {first.offset, norm.offset};
    c.layer_size_ = c.layers_.size() / config.n_layer;
  } else {
    c.grads_ = ModelParams::zeros(config);
    c.shard_ = {0, c.params_.n_values()};
    c.m_ = ModelParams::zeros(config);
    c.v_ = ModelParams::zeros(config);
  }
  return c;
}

Result<OptimizerCore> OptimizerCore::resume(const std::string& dir, const OptimizerOptions& options, dist::Comm* comm) {
  DC_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  DC_ASSIGN_OR_RETURN(ModelParams params, ModelParams::from_checkpoint(ckpt));
  OptimizerCore c = start(ckpt.config(), std::move(params), options, comm);
  int saved_shards = 1;
  DC_RETURN_IF_ERROR(load_train_state(dir, c.state_, &saved_shards));
  float* m = c.sharded() ? c.m_shard_.data() : c.m_.data();
  float* v = c.sharded() ? c.v_shard_.data() : c.v_.data();
  DC_RETURN_IF_ERROR(load_moments(dir, saved_shards, c.params_, c.shard_, m, v));
  return c;
}  // the mapped stored weights are released: training uses the f32 copies

int64_t OptimizerCore::optimizer_state_bytes() const {
  return 2 * shard_.size() * static_cast<int64_t>(sizeof(float));
}

int64_t OptimizerCore::gradient_bytes() const {
  return (grads_.n_values() + static_cast<int64_t>(g_shard_.size())) * static_cast<int64_t>(sizeof(float));
}

void OptimizerCore::begin_step() {
  if (!sharded()) return;
  std::fill(g_shard_.begin(), g_shard_.end(), 0.0f);
  layers_reduced_ = 0;
  grads_.set_layer_done([this](int64_t il) { return reduce_layer(il); });
}

Status OptimizerCore::reduce_layer(int64_t il) {
  float* slot = grads_.data() + layers_.begin;
  const dist::Range region{layers_.begin + il * layer_size_, layers_.begin + (il + 1) * layer_size_};
  DC_RETURN_IF_ERROR(comm_->reduce_scatter_add(slot, region, params_.n_values(), g_shard_.data()));
  std::fill_n(slot, layer_size_, 0.0f);
  ++layers_reduced_;
  return Status();
}

Status OptimizerCore::end_micro_batch() {
  if (!sharded()) return Status();
  const int64_t n_layer = config_.n_layer, done = layers_reduced_;
  layers_reduced_ = 0;
  if (done == n_layer) return Status();
  if (done != 0)
    return internal_error("ZeRO-2: a backward reduced " + std::to_string(done) + " of " + std::to_string(n_layer) +
                          " layers");
  for (int64_t il = n_layer - 1; il >= 0; --il) DC_RETURN_IF_ERROR(reduce_layer(il));  // no backward: zeros
  layers_reduced_ = 0;
  return Status();
}

OptimizerStepStats OptimizerCore::step(const Context& ctx, MixedPrecisionWeights* mixed) {
  OptimizerStepStats s;
  s.lr = learning_rate(options_.lr, state_.step);
  if (sharded()) {  // ZeRO: the rest of the reduction, the norm of all shards, AdamW on this shard, all-gather
    const int64_t n = params_.n_values();
    float* g_shard = g_shard_.data();  // the layers already reduced by the backward; now the other tensors
    Status st = comm_->reduce_scatter_add(grads_.data(), {0, layers_.begin}, n, g_shard);
    if (st.ok())
      st = comm_->reduce_scatter_add(grads_.data() + layers_.begin + layer_size_, {layers_.end, n}, n, g_shard);
    Result<std::vector<double>> sum = std::vector<double>{};
    if (st.ok()) sum = comm_->sum_doubles({sum_of_squares(g_shard, shard_.size(), ctx.pool)});
    if (st.ok()) st = sum.status();
    if (st.ok()) {
      s.grad_norm = std::sqrt((*sum)[0]);
      adamw_shard(params_, shard_, g_shard, m_shard_.data(), v_shard_.data(), state_.step + 1, s.lr,
                  options_.adam, clip_coefficient(s.grad_norm, options_.max_grad_norm), ctx.pool);
      st = comm_->all_gather(params_.data(), n);
    }
    if (!st.ok()) comm_->abort(1, "optimizer step " + std::to_string(state_.step + 1) + ": " + st.message());
  } else if (mixed != nullptr) {  // clipping and the next step's bf16 copies fused into AdamW: one pass over the state
    {
      const ProfileScope profile(ctx, "gradient norm");
      s.grad_norm = global_grad_norm(grads_, ctx.pool);
    }
    adamw_step_mixed(ctx, params_, grads_, m_, v_, state_.step + 1, s.lr, options_.adam,
                     clip_coefficient(s.grad_norm, options_.max_grad_norm), *mixed);
  } else {
    s.grad_norm = clip_grad_norm(grads_, options_.max_grad_norm, ctx.pool);
    adamw_step(params_, grads_, m_, v_, state_.step + 1, s.lr, options_.adam, ctx.pool);
  }
  s.step = ++state_.step;
  return s;
}

Result<std::string> OptimizerCore::save(const std::string& out_dir, const std::string& source_model_dir,
                                        const ExtraCheckpointFiles& extra) const {
  const std::string dir = (fs::path(out_dir) / checkpoint_name(state_.step)).string();
  if (sharded()) {
    DC_RETURN_IF_ERROR(save_sharded_train_checkpoint(*comm_, dir, source_model_dir, params_, m_shard_.data(),
                                                     v_shard_.data(), state_, extra));
    return dir;
  }
  DC_RETURN_IF_ERROR(save_train_checkpoint(dir, source_model_dir, params_, m_, v_, state_, extra));
  return dir;
}

Result<std::vector<std::string>> OptimizerCore::open_metrics(const std::string& out_dir) {
  if (comm_ != nullptr && comm_->rank() != 0) return std::vector<std::string>{};
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return io_error("cannot create " + out_dir + ": " + ec.message());
  const std::string path = (fs::path(out_dir) / "metrics.jsonl").string();
  std::vector<std::string> kept;
  std::string text;
  if (state_.step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        if (nlohmann::json::parse(line).at("step").get<int64_t>() > state_.step) continue;
      } catch (const std::exception&) {
        continue;  // a line cut by a kill
      }
      text += line + "\n";
      kept.push_back(std::move(line));
    }
  }
  DC_RETURN_IF_ERROR(write_text_file(path, text));
  metrics_path_ = path;
  return kept;
}

Status OptimizerCore::append_metrics(const std::string& json_object) const {
  if (metrics_path_.empty()) return Status();
  return append_text_file(metrics_path_, json_object + "\n");
}

}  // namespace dc::train
