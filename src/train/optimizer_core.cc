// OptimizerCore: start / resume, the optimizer step, checkpoints and metrics.jsonl.
#include "train/optimizer_core.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/dtype.h"
#include "core/profiler.h"
#include "io/atomic_dir.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"

namespace dc::train {
namespace fs = std::filesystem;

namespace {

// This host's MemAvailable (/proc/meminfo) shared by the ranks on it (OMPI_COMM_WORLD_LOCAL_SIZE, else
// all `ranks`); 0 when unknown.
int64_t memory_per_local_rank(int ranks) {
  std::ifstream in("/proc/meminfo");
  int64_t available = 0;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) available = std::atoll(line.c_str() + 13) * 1024;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int on_host = local != nullptr && std::atoi(local) > 0 ? std::atoi(local) : ranks;
  return available / std::max(1, on_host);
}

}  // namespace

// GradReduction: once per step when asked, or (kAuto) when the whole local buffer's extra bytes — the
// layers beyond the two slots and an untied lm_head — take at most a quarter of this rank's share of the
// host's available memory, on every rank. kAuto is overridden by DIFFUCODER_GRAD_REDUCTION=step |
// micro-batch (the benchmarks' and tests' switch). The ranks must agree (their reductions pair up): the
// choices are gathered, and an explicit one that differs between ranks (an environment variable not passed
// to every host: mpirun -x) ends the job with a message.
bool OptimizerCore::choose_once_per_step(int64_t extra_bytes) const {
  if (options_.micro_batches <= 1) return false;
  GradReduction rule = options_.reduction;
  const char* env = std::getenv("DIFFUCODER_GRAD_REDUCTION");
  if (env != nullptr && rule == GradReduction::kAuto) {
    const std::string v = env;
    if (v != "step" && v != "micro-batch" && v != "auto")
      comm_->abort(2, "DIFFUCODER_GRAD_REDUCTION=" + v + ": expected step, micro-batch or auto");
    rule = v == "step" ? GradReduction::kOncePerStep : v == "micro-batch" ? GradReduction::kPerMicroBatch : rule;
  }
  const bool once = rule == GradReduction::kOncePerStep ||
                    (rule == GradReduction::kAuto && extra_bytes <= memory_per_local_rank(comm_->size()) / 4);
  const double ranks = comm_->size();
  Result<std::vector<double>> votes = comm_->sum_doubles({once ? 1.0 : 0.0, rule == GradReduction::kAuto ? 0.0 : 1.0});
  if (!votes.ok()) comm_->abort(1, "choosing when to reduce the gradients: " + votes.status().message());
  const double n_once = (*votes)[0], n_explicit = (*votes)[1];
  if ((n_explicit != 0 && n_explicit != ranks) || (n_explicit == ranks && n_once != 0 && n_once != ranks))
    comm_->abort(2, "the ranks do not agree on when to reduce the gradients (DIFFUCODER_GRAD_REDUCTION differs "
                    "between them: pass it to every rank with mpirun -x DIFFUCODER_GRAD_REDUCTION)");
  return n_once == ranks;
}

OptimizerCore OptimizerCore::start(const ModelConfig& config, ModelParams params, const OptimizerOptions& options,
                                   dist::Comm* comm) {
  OptimizerCore c;
  c.config_ = config;
  c.options_ = options;
  c.params_ = std::move(params);
  c.comm_ = comm;
  c.resident_values_ = c.params_.n_values();
  if (c.sharded()) {
    c.shard_ = dist::shard_range(c.params_.n_values(), comm->rank(), comm->size());
    c.m_shard_.assign(static_cast<size_t>(c.shard_.size()), 0.0f);
    c.v_shard_.assign(static_cast<size_t>(c.shard_.size()), 0.0f);
    c.g_shard_.assign(static_cast<size_t>(c.shard_.size()), 0.0f);
    const ModelParams::Tensor& first = *c.params_.find("model.layers.0.input_layernorm.weight");
    const ModelParams::Tensor& norm = *c.params_.find("model.norm.weight");  // the first tensor after the layers
    c.layers_ = {first.offset, norm.offset};
    c.layer_size_ = c.layers_.size() / config.n_layer;
    c.table_size_ = c.params_.tensors().front().size;  // the embedding table, first
    const int64_t slots = std::min<int64_t>(2, config.n_layer);  // the backward writes one while the other is sent
    c.once_per_step_ = c.choose_once_per_step(
        4 * ((config.n_layer - slots) * c.layer_size_ + (config.tie_word_embeddings ? 0 : c.table_size_)));
    c.layer_slots_ = c.once_per_step_ ? config.n_layer : slots;
    c.grads_ = c.once_per_step_ ? ModelParams::zeros(config) : ModelParams::zeros_sharing_slots(config, slots);
  } else {
    c.grads_ = ModelParams::zeros(config);
    c.shard_ = {0, c.params_.n_values()};
    c.m_ = ModelParams::zeros(config);
    c.v_ = ModelParams::zeros(config);
  }
  return c;
}

Result<OptimizerCore> OptimizerCore::resume(const std::string& dir, const OptimizerOptions& options, dist::Comm* comm) {
  int saved_shards = 1;
  TrainState state;
  DC_RETURN_IF_ERROR(load_train_state(dir, state, &saved_shards));  // first: a missing file is the likelier damage
  DC_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  DC_ASSIGN_OR_RETURN(ModelParams params, ModelParams::from_checkpoint(ckpt));
  DC_RETURN_IF_ERROR(check_finite_params(params, (fs::path(dir) / "model.safetensors").string()));
  OptimizerCore c = start(ckpt.config(), std::move(params), options, comm);
  c.state_ = std::move(state);
  float* m = c.sharded() ? c.m_shard_.data() : c.m_.data();
  float* v = c.sharded() ? c.v_shard_.data() : c.v_.data();
  DC_RETURN_IF_ERROR(load_moments(dir, saved_shards, c.params_, c.shard_, m, v));
  return c;
}  // the mapped stored weights are released: training uses the f32 copies

int64_t OptimizerCore::optimizer_state_bytes() const {
  return 2 * shard_.size() * static_cast<int64_t>(sizeof(float));
}

int64_t OptimizerCore::master_weight_bytes() const {
  return resident_values_ * static_cast<int64_t>(sizeof(float));
}

bool OptimizerCore::forward_reads_f32(const ModelParams::Tensor& t, const MixedPrecisionWeights& mixed) {
  return mixed.panels_of(t.data) == nullptr || t.name == "model.embed_tokens.weight";  // the lookup reads f32
}

Status OptimizerCore::gather_mixed(const Context& ctx, MixedPrecisionWeights& mixed) {
  const ProfileScope profile(ctx, "all-gather of the weights (bf16 copies, f32 vectors)");
  const int64_t n = params_.n_values();
  std::vector<uint16_t> bf16;  // one matrix row-major, as the all-gather delivers it
  for (const ModelParams::Tensor& t : params_.tensors()) {
    const dist::Range region{t.offset, t.offset + t.size};
    const int64_t lo = std::max(shard_.begin, region.begin), hi = std::min(shard_.end, region.end);
    if (forward_reads_f32(t, mixed)) {  // whole in f32 on every rank; its panels (a tied lm_head) re-laid here
      DC_RETURN_IF_ERROR(comm_->all_gather_region(t.data, region, n, sizeof(float)));
      if (mixed.panels_of(t.data) == nullptr) continue;
      bf16.resize(static_cast<size_t>(t.size));
      parallel_for(ctx.pool, t.size, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) bf16[i] = f32_to_bf16(t.data[i]);
      }, 1 << 16);
      DC_RETURN_IF_ERROR(mixed.write_matrix(ctx, t.data, bf16.data()));
      continue;
    }
    // A matrix only the bf16 GEMMs read: this rank's part rounded, all-gathered in bf16 (half the bytes),
    // packed (its f32 masters outside the shard are given back after the loop).
    bf16.resize(static_cast<size_t>(t.size));
    for (int64_t i = lo; i < hi; ++i) bf16[i - t.offset] = f32_to_bf16(params_.data()[i]);
    DC_RETURN_IF_ERROR(comm_->all_gather_region(bf16.data(), region, n, sizeof(uint16_t)));
    DC_RETURN_IF_ERROR(mixed.write_matrix(ctx, t.data, bf16.data()));
  }
  if (masters_whole_) release_masters(mixed);  // (begin_step has given them back when it was handed `mixed`)
  mixed.mark_written();
  return Status();
}

void OptimizerCore::release_masters(const MixedPrecisionWeights& mixed) {
  const auto& ts = params_.tensors();
  released_.assign(ts.size(), false);
  resident_values_ = shard_.size();
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t lo = std::max(shard_.begin, ts[i].offset), hi = std::min(shard_.end, ts[i].offset + ts[i].size);
    if (forward_reads_f32(ts[i], mixed)) {
      resident_values_ += ts[i].size - std::max<int64_t>(0, hi - lo);
    } else {
      released_[i] = true;
      release_outside_shard(ts[i]);
    }
  }
  masters_whole_ = false;
}

void OptimizerCore::release_outside_shard(const ModelParams::Tensor& t) {
  const int64_t end = t.offset + t.size;
  const int64_t lo = std::max(shard_.begin, t.offset), hi = std::min(shard_.end, end);
  if (lo >= hi) {
    release_pages(t.data, static_cast<size_t>(t.size) * sizeof(float));
  } else {
    release_pages(t.data, static_cast<size_t>(lo - t.offset) * sizeof(float));
    release_pages(params_.data() + hi, static_cast<size_t>(end - hi) * sizeof(float));
  }
}

Status OptimizerCore::gather_masters_on_rank0() {
  const auto& ts = params_.tensors();
  for (size_t i = 0; i < released_.size(); ++i) {  // the same tensors on every rank
    if (!released_[i]) continue;
    DC_RETURN_IF_ERROR(comm_->all_gather_region(ts[i].data, {ts[i].offset, ts[i].offset + ts[i].size},
                                                params_.n_values(), sizeof(float)));
    if (comm_->rank() != 0) release_outside_shard(ts[i]);  // at most one tensor more than a step holds
  }
  if (comm_->rank() == 0 && !released_.empty()) masters_whole_ = true;  // until its next begin_step
  return Status();
}

Status OptimizerCore::mix_into(ModelParams& other, float alpha) {
  const float* p = params_.data();
  float* r = other.data();
  for (int64_t i = shard_.begin; i < shard_.end; ++i) r[i] = (1.0f - alpha) * r[i] + alpha * p[i];
  return sharded() ? comm_->all_gather(r, params_.n_values()) : Status();
}

int64_t OptimizerCore::gradient_bytes() const {
  return (grads_.n_values() + static_cast<int64_t>(g_shard_.size())) * static_cast<int64_t>(sizeof(float));
}

void OptimizerCore::begin_step(const MixedPrecisionWeights* mixed) {
  if (!sharded() || state_on_device_) return;
  if (mixed != nullptr && masters_whole_) release_masters(*mixed);  // the copies hold them now
  std::fill(g_shard_.begin(), g_shard_.end(), 0.0f);
  parts_reduced_ = 0, micro_ = 0;
  grads_.set_head_done([this] { return reduce_head(); });
  grads_.set_layer_done([this](int64_t il) { return reduce_layer(il); });
}

Status OptimizerCore::start_reduce(float* slot, int64_t offset, int64_t size, size_t keep) {
  DC_ASSIGN_OR_RETURN(const int64_t handle, comm_->reduce_scatter_add_start(slot, {offset, offset + size},
                                                                             params_.n_values(), g_shard_.data()));
  in_flight_.push_back({handle, once_per_step_ ? nullptr : slot, size});  // (a whole buffer is overwritten next step)
  return finish_reduces(keep);
}

Status OptimizerCore::finish_reduces(size_t keep) {
  while (in_flight_.size() > keep) {
    const InFlight f = in_flight_.front();
    in_flight_.erase(in_flight_.begin());
    DC_RETURN_IF_ERROR(comm_->finish(f.handle));
    if (f.slot != nullptr) std::fill_n(f.slot, f.size, 0.0f);  // for its next user
  }
  return Status();
}

Status OptimizerCore::reduce_head() {
  ++parts_reduced_;
  if (!reducing()) return Status();  // once per step: not before the last micro-batch
  constexpr size_t kAll = ~size_t{0};  // both stay in flight through the last layer's backward
  const int64_t norm_size = config_.n_embd;  // model.norm.weight, right after the layers (flat offset layers_.end)
  DC_RETURN_IF_ERROR(start_reduce(grads_.find("model.norm.weight")->data, layers_.end, norm_size, kAll));
  if (config_.tie_word_embeddings) return Status();  // the lm_head's gradient is the table's: reduced last
  // lm_head.weight: in the table's slot (shared slots), which the lookup's backward writes once the layers are
  // done, so it is finished at the first layer's start (keep 1 below) at the latest
  return start_reduce(grads_.find("lm_head.weight")->data, layers_.end + norm_size, table_size_, kAll);
}

// Layer il's reduce-scatter started; all but it finished: the one of layer il + 1 (whose slot layer il − 1
// reuses with two slots), and the head's.
Status OptimizerCore::reduce_layer(int64_t il) {
  ++parts_reduced_;
  if (!reducing()) return Status();
  float* slot = grads_.data() + layers_.begin + (il % layer_slots_) * layer_size_;
  return start_reduce(slot, layers_.begin + il * layer_size_, layer_size_, 1);
}

Status OptimizerCore::end_micro_batch() {
  if (!sharded() || state_on_device_) return Status();
  const int64_t parts = config_.n_layer + 1, done = parts_reduced_;  // the head, then the layers
  parts_reduced_ = 0;
  if (done != parts && done != 0)
    return internal_error("ZeRO-2: a backward reduced " + std::to_string(done) + " of its " + std::to_string(parts) +
                          " parts (the lm_head and final norm, then the layers)");
  if (reducing()) {
    if (done == 0) {  // no backward: its part in the reductions the other ranks' backwards run (with zeros in
                      // the slots, or what the earlier micro-batches accumulated)
      DC_RETURN_IF_ERROR(reduce_head());
      for (int64_t il = config_.n_layer - 1; il >= 0; --il) DC_RETURN_IF_ERROR(reduce_layer(il));
    }
    DC_RETURN_IF_ERROR(finish_reduces(0));
    // the embedding table, written last: blocking (nothing left to overlap), in 4 MiB chunks
    DC_RETURN_IF_ERROR(comm_->reduce_scatter_add(grads_.data(), {0, table_size_}, params_.n_values(), g_shard_.data()));
    if (!once_per_step_) std::fill_n(grads_.data(), table_size_, 0.0f);
  }
  parts_reduced_ = 0;
  ++micro_;
  return Status();
}

std::string skip_cause(double loss, double grad_norm) {
  auto text = [](double x) { return std::isnan(x) ? std::string("nan") : x > 0 ? std::string("inf") : std::string("-inf"); };
  if (!std::isfinite(loss)) return "the loss is " + text(loss);
  if (!std::isfinite(grad_norm)) return "the gradient norm is " + text(grad_norm);
  return "";
}

OptimizerStepStats OptimizerCore::step(const Context& ctx, MixedPrecisionWeights* mixed, double loss) {
  OptimizerStepStats s;
  s.lr = learning_rate(options_.lr, state_.step);
  if (sharded()) {  // ZeRO: the norm of all shards (reduced by the micro-batches), AdamW on this shard, all-gather
    if (!in_flight_.empty() || (once_per_step_ && micro_ != options_.micro_batches))
      comm_->abort(1, "optimizer step " + std::to_string(state_.step + 1) + ": internal error: " +
                          std::to_string(micro_) + " micro-batches ended of the " + std::to_string(options_.micro_batches) +
                          " the gradients are reduced over, " + std::to_string(in_flight_.size()) + " reductions in flight");
    sharded_update(ctx, mixed, loss, s);
  } else if (mixed != nullptr) {  // clipping and the next step's bf16 copies fused into AdamW: one pass over the state
    {
      const ProfileScope profile(ctx, "gradient norm");
      s.grad_norm = global_grad_norm(grads_, ctx.pool);
    }
    s.skip_cause = skip_cause(loss, s.grad_norm);
    if (s.skip_cause.empty())
      adamw_step_mixed(ctx, params_, grads_, m_, v_, state_.step + 1, s.lr, options_.adam,
                       clip_coefficient(s.grad_norm, options_.max_grad_norm), *mixed);
  } else {
    s.grad_norm = clip_grad_norm(grads_, options_.max_grad_norm, ctx.pool);
    s.skip_cause = skip_cause(loss, s.grad_norm);
    if (s.skip_cause.empty()) adamw_step(params_, grads_, m_, v_, state_.step + 1, s.lr, options_.adam, ctx.pool);
  }
  // The bf16 copies still hold the unchanged weights after a skip: the next refresh keeps them (sharded, the
  // masters outside this rank's shard may already be given back and must not be re-laid from).
  if (!s.skip_cause.empty() && mixed != nullptr) mixed->mark_written();
  return count_step(std::move(s));
}

void OptimizerCore::sharded_update(const Context& ctx, MixedPrecisionWeights* mixed, double loss, OptimizerStepStats& s,
                                   const ShardUpdate& update) {
  Result<std::vector<double>> sum = comm_->sum_doubles({sum_of_squares(g_shard_.data(), shard_.size(), ctx.pool)});
  Status st = sum.status();
  if (st.ok()) {
    s.grad_norm = std::sqrt((*sum)[0]);
    s.skip_cause = skip_cause(loss, s.grad_norm);  // the same on every rank: the reduced norm and loss
    if (s.skip_cause.empty()) {
      const float clip = clip_coefficient(s.grad_norm, options_.max_grad_norm);
      if (update) {
        st = update(g_shard_.data(), clip, s.lr);
      } else {
        adamw_shard(params_, shard_, g_shard_.data(), m_shard_.data(), v_shard_.data(), state_.step + 1, s.lr,
                    options_.adam, clip, ctx.pool);
      }
      if (st.ok()) st = mixed != nullptr ? gather_mixed(ctx, *mixed) : comm_->all_gather(params_.data(), params_.n_values());
    }
  }
  if (!st.ok()) comm_->abort(1, "optimizer step " + std::to_string(state_.step + 1) + ": " + st.message());
}

OptimizerCore::ShardMoments OptimizerCore::hand_state_to_device() {
  DC_CHECK(sharded() && !state_on_device_, "OptimizerCore::hand_state_to_device: a sharded core, once");
  state_on_device_ = true;
  grads_ = ModelParams();
  return {std::exchange(m_shard_, {}), std::exchange(v_shard_, {})};
}

void OptimizerCore::restore_shard_moments(ShardMoments moments) {
  DC_CHECK(state_on_device_ && static_cast<int64_t>(moments.m.size()) == shard_.size() &&
               static_cast<int64_t>(moments.v.size()) == shard_.size(),
           "OptimizerCore::restore_shard_moments: the shard's moments of a core that handed them over");
  m_shard_ = std::move(moments.m), v_shard_ = std::move(moments.v);
}

OptimizerStepStats OptimizerCore::step_local_grads(const Context& ctx, const float* local, double loss,
                                                   const ShardUpdate& update) {
  DC_CHECK(state_on_device_ && in_flight_.empty() && update, "OptimizerCore::step_local_grads: after hand_state_to_device");
  const int64_t n = params_.n_values();
  std::fill(g_shard_.begin(), g_shard_.end(), 0.0f);
  const Status reduced = comm_->reduce_scatter_add(local, {0, n}, n, g_shard_.data());
  if (!reduced.ok())
    comm_->abort(1, "optimizer step " + std::to_string(state_.step + 1) + ": reduce-scatter of the gradients: " +
                        reduced.message());
  OptimizerStepStats s;
  s.lr = learning_rate(options_.lr, state_.step);
  sharded_update(ctx, nullptr, loss, s, update);
  return count_step(std::move(s));
}

OptimizerStepStats OptimizerCore::count_step(OptimizerStepStats s) {
  s.skipped = !s.skip_cause.empty();
  if (s.skipped) ++consecutive_skips_, ++state_.skipped_steps;
  else consecutive_skips_ = 0;
  s.step = ++state_.step;
  return s;
}

std::string skip_note(const std::string& who, const OptimizerStepStats& s, int64_t consecutive) {
  return who + " step " + std::to_string(s.step) + ": update skipped: " + s.skip_cause +
         "; the weights stay those of step " + std::to_string(s.step - consecutive) + " (" +
         std::to_string(consecutive) + " skipped in a row; the run stops at " + std::to_string(kMaxConsecutiveSkips) + ")";
}

Status too_many_skips(const std::string& who, const OptimizerStepStats& s, int64_t consecutive) {
  return invalid_argument(who + " step " + std::to_string(s.step) + ": " + s.skip_cause + "; the last " +
                          std::to_string(consecutive) + " steps were all skipped (a non-finite loss or gradient "
                          "norm): the run diverged or its data or rewards are broken; stopping with the weights of step " +
                          std::to_string(s.step - consecutive) + " (lower --lr or --max-grad-norm, check the data, or "
                          "resume from an older checkpoint)");
}

Result<std::string> OptimizerCore::save(const std::string& out_dir, const std::string& source_model_dir,
                                        const ExtraCheckpointFiles& extra) {
  const std::string dir = (fs::path(out_dir) / checkpoint_name(state_.step)).string();
  if (sharded()) {
    if (state_on_device_ && m_shard_.empty())
      return internal_error("OptimizerCore::save: the moments are on the device (restore_shard_moments first)");
    DC_RETURN_IF_ERROR(gather_masters_on_rank0());  // rank 0 writes them; it gives them back at its next step
    const Status saved = save_sharded_train_checkpoint(*comm_, dir, source_model_dir, params_, m_shard_.data(),
                                                       v_shard_.data(), state_, extra);
    if (state_on_device_) m_shard_ = std::vector<float>(), v_shard_ = std::vector<float>();  // the device holds them
    DC_RETURN_IF_ERROR(saved);
    return dir;
  }
  DC_RETURN_IF_ERROR(save_train_checkpoint(dir, source_model_dir, params_, m_, v_, state_, extra));
  return dir;
}

Result<std::vector<std::string>> open_metrics_file(const std::string& out_dir, int64_t step, std::string* path) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return io_error("cannot create " + out_dir + ": " + ec.message());
  *path = (fs::path(out_dir) / "metrics.jsonl").string();
  std::vector<std::string> kept;
  std::string text;
  if (step > 0) {
    std::ifstream in(*path);
    for (std::string line; std::getline(in, line);) {
      try {
        if (nlohmann::json::parse(line).at("step").get<int64_t>() > step) continue;
      } catch (const std::exception&) {
        continue;  // a line cut by a kill
      }
      text += line + "\n";
      kept.push_back(std::move(line));
    }
  }
  DC_RETURN_IF_ERROR(write_text_file(*path, text));
  return kept;
}

Result<std::vector<std::string>> OptimizerCore::open_metrics(const std::string& out_dir) {
  if (comm_ != nullptr && comm_->rank() != 0) return std::vector<std::string>{};
  return open_metrics_file(out_dir, state_.step, &metrics_path_);
}

Status OptimizerCore::append_metrics(const std::string& json_object) const {
  if (metrics_path_.empty()) return Status();
  return append_text_file(metrics_path_, json_object + "\n");
}

}  // namespace dc::train
