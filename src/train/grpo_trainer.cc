// GrpoTrainer: setup and resume, a round's rollout and no-gradient passes, the optimizer step, the
// reference model's sync, metrics and checkpoints.
#include "train/grpo_trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/log.h"
#include "io/atomic_dir.h"
#include "gguf/model_source.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "train/plot.h"
#include "train/rng.h"

namespace dc::train {
namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string grpo_fingerprint(const GrpoOptions& o) {
  std::ostringstream os;
  os.precision(17);
  os << "grpo n_prompts=" << o.n_prompts << " steps=" << o.steps << " G=" << o.group_size
     << " prompts_per_round=" << o.prompts_per_round << " accum=" << o.grad_accum << " iterations=" << o.num_iterations
     << " random_masking=" << o.random_masking << " scale_rewards=" << o.scale_rewards << " beta=" << o.loss.beta
     << " epsilon=" << o.loss.epsilon << " sync=" << o.ref_sync_steps << " alpha=" << o.ref_mixup_alpha
     << " lr=" << o.lr.lr << " sched=" << static_cast<int>(o.lr.schedule) << " min_lr=" << o.lr.min_lr_ratio
     << " warmup_ratio=" << o.warmup_ratio << " b1=" << o.adam.beta1 << " b2=" << o.adam.beta2 << " eps=" << o.adam.eps
     << " wd=" << o.adam.weight_decay << " clip=" << o.max_grad_norm << " seed=" << o.seed
     << " precision=" << (o.precision == MatmulPrecision::kBF16 ? "bf16" : "f32");
  os << lora_fingerprint(o.lora);
  return os.str();
}

// The options' real numbers (NaN fails every check), named by flag and field.
Status check_grpo_numbers(const GrpoOptions& o) {
  DC_RETURN_IF_ERROR(check_optimizer_options(o.lr, o.adam, o.max_grad_norm));
  DC_RETURN_IF_ERROR(check_finite_in("--warmup-ratio (warmup_ratio)", o.warmup_ratio, 0.0, 1.0));
  DC_RETURN_IF_ERROR(check_finite_in("--beta (loss.beta)", o.loss.beta, 0.0, 1e6));
  DC_RETURN_IF_ERROR(check_finite_in("--epsilon (loss.epsilon)", o.loss.epsilon, 0.0, 1.0));
  DC_RETURN_IF_ERROR(check_finite_in("--ref-mixup-alpha (ref_mixup_alpha)", o.ref_mixup_alpha, 0.0, 1.0));
  if (o.ref_sync_steps < 0 || o.save_every < 0)
    return invalid_argument("--ref-sync-steps and --save-every must be >= 0");
  return Status();
}

// Rows [begin, begin + n) of a [rows, width] array.
template <typename T>
std::vector<T> slice(const std::vector<T>& v, int64_t begin, int64_t n, int64_t width) {
  return std::vector<T>(v.begin() + begin * width, v.begin() + (begin + n) * width);
}

}  // namespace

Result<std::unique_ptr<GrpoTrainer>> GrpoTrainer::create(const GrpoOptions& o, const Context& ctx, RolloutFn rollout) {
  if (o.group_size < 2) return invalid_argument("--num-generations must be at least 2 (leave-one-out advantages)");
  if (o.prompts_per_round < 1 || o.grad_accum < 1 || o.num_iterations < 1 || o.steps < 1 || o.n_prompts < 1)
    return invalid_argument("--prompts-per-round, --grad-accum, --num-iterations, --steps and the data size must be at least 1");
  if (o.prompts_per_round * o.group_size % o.grad_accum != 0)
    return invalid_argument("--grad-accum " + std::to_string(o.grad_accum) + " must divide the " +
                            std::to_string(o.prompts_per_round * o.group_size) + " completions of a round");
  if (o.steps % o.num_iterations != 0)
    return invalid_argument("--steps " + std::to_string(o.steps) + " must be a multiple of --num-iterations " +
                            std::to_string(o.num_iterations) + " (whole rounds)");
  const int ranks = o.comm == nullptr ? 1 : o.comm->size();
  if (o.prompts_per_round % ranks != 0 || o.grad_accum % ranks != 0)
    return invalid_argument("--prompts-per-round " + std::to_string(o.prompts_per_round) + " and --grad-accum " +
                            std::to_string(o.grad_accum) + " must be multiples of the " + std::to_string(ranks) +
                            " ranks: each rank generates whole groups of prompts_per_round / ranks prompts and runs "
                            "grad_accum / ranks micro-batches");
  DC_RETURN_IF_ERROR(check_grpo_numbers(o));
  std::unique_ptr<GrpoTrainer> t(new GrpoTrainer());
  t->opt_ = o;
  t->opt_.lr.total_steps = o.steps;
  t->opt_.lr.warmup_steps = static_cast<int64_t>(std::ceil(o.warmup_ratio * static_cast<double>(o.steps)));
  t->ctx_ = ctx;
  t->ctx_.workspace = &t->workspace_;
  if (ctx.device != Device::kCpu)  // LoRA's dropout refused by name, f32 (train/device_training.h)
    set_device_training_precision(ctx, &t->opt_.precision);
  t->ctx_.matmul_precision = t->opt_.precision;
  if (t->opt_.precision == MatmulPrecision::kBF16 && !bf16_backward(t->ctx_)) {
    dc::log(LogLevel::kWarning, "this CPU has no AVX512_BF16 (or reference kernels are on): GRPO in f32");
    t->ctx_.matmul_precision = t->opt_.precision = MatmulPrecision::kF32;
  }
  t->rollout_ = std::move(rollout);
  DC_ASSIGN_OR_RETURN(const std::string latest, checkpoint_to_resume(o.out_dir, o.resume, o.force));
  const OptimizerOptions optimizer{t->opt_.lr, o.adam, o.max_grad_norm,
                                   o.comm != nullptr ? o.grad_accum / o.comm->size() : 1};  // micro-batches per rank
  const std::string fingerprint = grpo_fingerprint(t->opt_);
  DC_RETURN_IF_ERROR(check_checkpoint_kind(latest, o.lora.r > 0));
  if (o.lora.r > 0) {
    DC_RETURN_IF_ERROR(t->create_lora(optimizer, latest, fingerprint));
  } else if (!latest.empty()) {
    DC_ASSIGN_OR_RETURN(t->core_, OptimizerCore::resume(latest, optimizer, o.comm));
    const std::string& saved = t->core_.state().options;
    if (saved != fingerprint)
      return invalid_argument("--resume: the options differ from those of " + latest + " (pass the saved values, or "
                              "--force to start over):\n  saved: " + saved + "\n  now:   " + fingerprint);
    DC_RETURN_IF_ERROR(check_resumed_state(latest, t->core_.state(),
                                           {o.steps, o.num_iterations, o.prompts_per_round, o.seed}));
  } else {
    ModelConfig config;
    DC_ASSIGN_OR_RETURN(ModelParams params, load_trainable_params(o.model_dir, &config));
    t->core_ = OptimizerCore::start(config, std::move(params), optimizer, o.comm);
    t->core_.state().seed = o.seed;
    t->core_.state().options = fingerprint;
  }  // the mapped stored weights are released: training uses the f32 copies
  if (o.lora.r <= 0) {
    t->config_ = t->core_.config();
    DC_ASSIGN_OR_RETURN(t->ref_, ModelParams::from_weights(t->config_, t->core_.params().weights()));
    if (!latest.empty())
      DC_RETURN_IF_ERROR(read_params_safetensors((fs::path(latest) / "ref_model.safetensors").string(), t->ref_));
  }
  const ModelConfig& config = t->config_;
  if (config.mask_token_id < 0 || config.mask_token_id >= config.n_vocab)
    return invalid_argument("config.json mask_token_id is outside the vocabulary");
  t->acts_.recompute = o.recompute;
  t->order_ = std::make_unique<DataOrder>(o.n_prompts, o.seed);
  if (o.out_dir.empty()) return t;
  // metrics.jsonl: the lines of the steps already done stay (a resumed run continues the same curve).
  DC_ASSIGN_OR_RETURN(std::vector<std::string> kept,
                      t->lora() ? t->lora_core_.open_metrics(o.out_dir) : t->core_.open_metrics(o.out_dir));
  for (const std::string& line : kept) {
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.contains("reward_mean") || !j["reward_mean"].is_number()) continue;
    GrpoStepStats s;
    s.step = j["step"], s.reward_mean = j["reward_mean"];
    t->history_.push_back(s);
  }
  return t;
}

Status GrpoTrainer::create_lora(const OptimizerOptions& optimizer, const std::string& latest,
                                const std::string& fingerprint) {
  DC_RETURN_IF_ERROR(check_lora_spec(opt_.lora));
  DC_ASSIGN_OR_RETURN(base_, load_model_source(opt_.model_dir, ctx_.pool));
  config_ = base_->config();
  const std::string ref_path = (fs::path(latest) / "ref_adapter_model.safetensors").string();
  if (!latest.empty()) {
    DC_ASSIGN_OR_RETURN(lora_core_, LoraCore::resume(latest, config_, optimizer, opt_.comm));
    const std::string& saved = lora_core_.state().options;
    if (saved != fingerprint)
      return invalid_argument("--resume: the options differ from those of " + latest + " (pass the saved values, or "
                              "--force to start over):\n  saved: " + saved + "\n  now:   " + fingerprint);
    DC_RETURN_IF_ERROR(check_resumed_state(latest, lora_core_.state(),
                                           {opt_.steps, opt_.num_iterations, opt_.prompts_per_round, opt_.seed}));
  } else {
    lora_core_ = LoraCore::start(config_, opt_.lora, opt_.seed, optimizer, opt_.comm);
    lora_core_.state().options = fingerprint;
  }
  ref_lora_ = LoraParams::zeros_like(lora_core_.params());
  std::copy_n(lora_core_.params().data(), ref_lora_.n_values(), ref_lora_.data());  // the reference starts as the policy
  if (!latest.empty()) {
    DC_ASSIGN_OR_RETURN(const SafetensorsFile file, SafetensorsFile::open(ref_path));
    for (const LoraParams::Tensor& t : ref_lora_.tensors()) {
      const TensorInfo* info = file.find(t.name);
      if (info == nullptr || info->dtype != DType::kF32 || info->shape != t.shape)
        return invalid_argument(ref_path + ": no f32 tensor " + t.name + " of the adapter's shape");
      std::copy_n(static_cast<const float*>(info->data), t.size, ref_lora_.data() + t.offset);
    }
  }
  base_transposed_ = pack_frozen_base(ctx_, *base_);
  return Status();
}

std::unique_ptr<Model> GrpoTrainer::policy_model() {
  if (lora()) {  // the frozen base's weights plus the adapters (no dropout outside the loss's training forward)
    policy_adapters_ = lora_core_.params().weights();
    auto model = Model::from_weights(config_, base_->weights(), nullptr);
    model->set_lora(&policy_adapters_);
    return model;
  }
  return Model::from_weights(core_.config(),
                             ctx_.matmul_precision == MatmulPrecision::kBF16 ? mixed_.forward() : core_.params().weights(),
                             nullptr);
}

Result<std::vector<double>> GrpoTrainer::gather(const std::vector<double>& values) {
  if (ranks() == 1) return values;
  const int64_t k = static_cast<int64_t>(values.size());
  std::vector<double> all(static_cast<size_t>(k * ranks()));
  DC_RETURN_IF_ERROR(opt_.comm->all_gather_doubles(values.data(), k, all.data()));
  return all;
}

Status GrpoTrainer::start_round() {
  TrainState& state = this->state();
  const ModelConfig& config = config_;
  const int64_t I = opt_.num_iterations, G = opt_.group_size, round = state.step / I;
  // This rank's whole groups: its contiguous share of the round's prompts (every rank advances the cursor).
  const int64_t per_rank = opt_.prompts_per_round / ranks();
  std::vector<int64_t> prompts;
  for (int64_t i = 0; i < opt_.prompts_per_round; ++i) {
    const int64_t p = order_->sample_at(state.cursor++);
    if (i / per_rank == rank()) prompts.push_back(p);
  }
  const std::unique_ptr<Model> policy = policy_model();
  const auto t0 = Clock::now();
  DC_ASSIGN_OR_RETURN(Rollout r, rollout_(ctx_, *policy, round, prompts));
  round_stats_ = GrpoStepStats{};
  round_stats_.rollout_seconds = since(t0);
  const int64_t n_local = per_rank * G, C = r.batch.n_completion;
  if (r.batch.n_batch != n_local)
    return internal_error("GRPO rollout: " + std::to_string(r.batch.n_batch) + " completions for " + std::to_string(n_local));
  if (!r.batch.prompt_mask.empty() && static_cast<int64_t>(r.batch.prompt_mask.size()) != n_local * r.batch.n_prompt)
    return internal_error("GRPO rollout: a prompt_mask of " + std::to_string(r.batch.prompt_mask.size()) +
                          " entries for " + std::to_string(n_local) + " prompts of " + std::to_string(r.batch.n_prompt));
  const auto t1 = Clock::now();
  // Mask seeds (spec §4.5 step 7): one per iteration, in [0, 4096), or 42 without random masking.
  std::vector<uint64_t> seeds(I, 42);
  if (opt_.random_masking)
    for (int64_t k = 0; k < I; ++k) seeds[k] = hash_counters(state.seed, 0x67727030, round, k) % 4096;
  const bool mixed = ctx_.matmul_precision == MatmulPrecision::kBF16;
  MixedPrecisionWeights ref_mixed;  // the reference model's bf16 copies, for this round's passes
  std::unique_ptr<Model> ref_model;
  if (opt_.loss.beta != 0 && lora()) {  // the base plus the adapters' reference copy
    ref_model = Model::from_weights(config, base_->weights(), nullptr);
    ref_model->set_lora(&ref_lora_.weights());
  } else if (opt_.loss.beta != 0) {
    if (mixed) DC_RETURN_IF_ERROR(ref_mixed.refresh(ctx_, ref_.weights()));
    ref_model = Model::from_weights(config, mixed ? ref_mixed.forward() : ref_.weights(), nullptr);
    if (device_ != nullptr && !ref_on_device_) {  // uploaded once, then refreshed after each sync
      DC_RETURN_IF_ERROR(device_->upload_reference(ctx_, *ref_model));
      ref_on_device_ = true;
    }
  }
  DeviceLossRows* device_rows = device_ != nullptr ? &device_->rows() : device_lora_ != nullptr ? &device_lora_->rows() : nullptr;
  const int64_t n_micro = opt_.grad_accum / ranks(), mb = n_local / n_micro, P = r.batch.n_prompt;
  round_.assign(n_micro, Micro{});
  for (int64_t a = 0; a < n_micro; ++a) {
    Micro& m = round_[a];
    m.batch.n_batch = mb, m.batch.n_prompt = P, m.batch.n_completion = C;
    m.batch.prompt_ids = slice(r.batch.prompt_ids, a * mb, mb, P);
    m.batch.completion_ids = slice(r.batch.completion_ids, a * mb, mb, C);
    m.batch.completion_mask = slice(r.batch.completion_mask, a * mb, mb, C);
    if (!r.batch.prompt_mask.empty()) m.batch.prompt_mask = slice(r.batch.prompt_mask, a * mb, mb, P);  // the rollout's pads
    for (int64_t k = 0; k < I; ++k) {
      DC_ASSIGN_OR_RETURN(CoupledRows rows, coupled_rows(m.batch, draw_coupled_mask(mb, C, seeds[k]),
                                                         static_cast<int32_t>(config.mask_token_id), config.n_vocab,
                                                         false));
      std::vector<float> old, ref;
      // With one iteration the old log-probs are the current ones (ratio 1); else from this pass.
      if (I > 1) {
        DC_ASSIGN_OR_RETURN(old, coupled_logps(ctx_, *policy, rows, C, device_rows));
      }
      if (ref_model) {
        DC_ASSIGN_OR_RETURN(ref, coupled_logps(ctx_, *ref_model, rows, C, device_rows));
      }
      m.rows.push_back(std::move(rows));
      m.old_logps.push_back(std::move(old));
      m.ref_logps.push_back(std::move(ref));
    }
  }
  // The rewards last: their scoring (Rollout::await_rewards) overlaps the passes above.
  if (r.await_rewards) DC_RETURN_IF_ERROR(r.await_rewards(r));
  DC_RETURN_IF_ERROR(round_advantages(r, round));
  round_stats_.score_seconds = since(t1);
  return Status();
}

Status GrpoTrainer::round_advantages(const Rollout& r, int64_t round) {
  const int64_t G = opt_.group_size, n_local = r.batch.n_batch, N = n_local * ranks(), C = r.batch.n_completion;
  if (static_cast<int64_t>(r.rewards.size()) != n_local)
    return internal_error("GRPO rollout: " + std::to_string(r.rewards.size()) + " rewards for " + std::to_string(n_local) +
                          " completions");
  // The round's rewards, every rank's in rank order (the reference gathers them before grouping), the
  // rollout metrics' means over ranks and the tokens generated; the metric count checked first, so that
  // ranks whose rollouts disagree on it fail together instead of mismatching the gather.
  DC_ASSIGN_OR_RETURN(const std::vector<double> rewards, gather(r.rewards));
  const size_t n_metrics = r.metrics.size();
  DC_ASSIGN_OR_RETURN(const std::vector<double> counts, gather({static_cast<double>(n_metrics)}));
  for (double c : counts)
    if (c != static_cast<double>(n_metrics))
      return internal_error("GRPO rollout: the ranks' rollouts return different numbers of metrics");
  std::vector<double> mine = {static_cast<double>(n_local * C)};
  for (const auto& m : r.metrics) mine.push_back(m.second);
  DC_ASSIGN_OR_RETURN(const std::vector<double> all, gather(mine));
  round_stats_.metrics = r.metrics;
  for (size_t j = 0; j < n_metrics; ++j) {
    double total = 0;
    for (int q = 0; q < ranks(); ++q) total += all[q * mine.size() + 1 + j];
    round_stats_.metrics[j].second = total / ranks();
  }
  for (int q = 0; q < ranks(); ++q) round_stats_.rollout_tokens += static_cast<int64_t>(all[q * mine.size()]);
  Result<std::vector<double>> advantages = leave_one_out_advantages(rewards, G, opt_.scale_rewards);
  if (!advantages.ok())  // e.g. a reward beyond kMaxAbsReward: the round is not trained on
    return invalid_argument("GRPO step " + std::to_string(state().step + 1) + " (round " + std::to_string(round) +
                            "): " + advantages.status().message());
  const std::vector<double>& all_adv = *advantages;
  const std::vector<double> adv = slice(all_adv, rank() * n_local, n_local, 1);  // this rank's rows
  double sum = 0, sq = 0;
  for (double x : rewards) sum += std::isnan(x) ? 0 : x;
  for (double x : rewards) sq += std::pow((std::isnan(x) ? 0 : x) - sum / N, 2);
  round_stats_.reward_mean = sum / N;
  round_stats_.reward_std = std::sqrt(sq / static_cast<double>(N - 1));

  const int64_t mb = n_local / static_cast<int64_t>(round_.size());
  for (size_t a = 0; a < round_.size(); ++a) round_[a].advantages = slice(adv, static_cast<int64_t>(a) * mb, mb, 1);
  return Status();
}

DeviceBatchShape GrpoTrainer::device_batch_shape() const {
  // A round: prompts_per_round · G rows of at most max_prompt_length + max_completion_length positions; a
  // micro-batch: its share of the rows, each in three versions (coupled_rows), a completion position scored twice.
  const int64_t rows = opt_.prompts_per_round * opt_.group_size / ranks(), micro_rows = rows / (opt_.grad_accum / ranks());
  const int64_t C = opt_.max_completion_length, S = opt_.max_prompt_length + C;
  DeviceBatchShape b;
  b.positions = 3 * micro_rows * S, b.loss_rows = 2 * micro_rows * C, b.recompute = opt_.recompute;
  b.rollout_positions = rows * S, b.rollout_sampled = rows * C;
  if (opt_.rollout_kv_cache) b.rollout_kv_rows = rows, b.rollout_kv_seq = S;
  b.smaller_batch = "fewer --prompts-per-round or --num-generations, a larger --grad-accum, or a smaller --max-prompt-length or "
                    "--max-completion-length";
  return b;
}

Result<GrpoStepStats> GrpoTrainer::step() {
  try {
    const auto t0 = Clock::now();
    const bool lora = this->lora();
    const bool mixed = !lora && ctx_.matmul_precision == MatmulPrecision::kBF16;  // LoRA: the base is read as stored
    if (mixed) DC_RETURN_IF_ERROR(mixed_.refresh(ctx_, core_.params().weights()));
    const int64_t I = opt_.num_iterations, k = steps_done() % I;
    if (ctx_.device != Device::kCpu && lora && device_lora_ == nullptr) {  // the base, adapters and their state there
      DC_ASSIGN_OR_RETURN(device_lora_, DeviceLoraTraining::start(ctx_, *base_, lora_core_, device_batch_shape(),
                                                                  opt_.loss.beta != 0 ? &ref_lora_ : nullptr));
    } else if (ctx_.device != Device::kCpu && device_ == nullptr) {  // the policy's weights, gradients and moments there
      DC_ASSIGN_OR_RETURN(device_, DeviceTraining::start(ctx_, *policy_model(), &core_, device_batch_shape(), opt_.loss.beta != 0));
    }
    if (k == 0 || round_.empty()) {
      const Status started = start_round();
      if (!started.ok()) round_.clear();  // a round half prepared is not trained on
      DC_RETURN_IF_ERROR(started);
    }
    GrpoStepStats s = round_stats_;
    if (k != 0) s.rollout_tokens = 0, s.rollout_seconds = 0, s.score_seconds = 0;
    const auto t1 = Clock::now();
    const std::unique_ptr<Model> model = policy_model();
    if (device_lora_ != nullptr) DC_RETURN_IF_ERROR(device_lora_->grads().zero(ctx_));  // the backwards add
    else if (lora) lora_core_.begin_step();  // zeroes the adapters' gradients; the backwards add
    else core_.begin_step(mixed ? &mixed_ : nullptr);  // no zeroing pass: the first micro-batch writes the gradients
    const double scale = 1.0 / static_cast<double>(opt_.grad_accum);
    for (Micro& m : round_) {
      GrpoLossInputs in;
      in.batch = &m.batch, in.rows = &m.rows[k], in.advantages = m.advantages;
      in.old_logps = m.old_logps[k], in.ref_logps = m.ref_logps[k];
      GrpoLossResult r;
      const GradWrite write = &m == &round_.front() ? GradWrite::kOverwrite : GradWrite::kAdd;
      if (lora) {  // the adapters' dropout draws a fresh mask per micro-batch
        LoraWeights adapters = lora_core_.params().weights();
        adapters.dropout_key = hash_counters(state().seed, 0x6c6f7261, static_cast<uint64_t>(steps_done()),
                                             static_cast<uint64_t>(&m - round_.data()) + 1000 * static_cast<uint64_t>(rank()));
        if (device_lora_ != nullptr) {
          DC_ASSIGN_OR_RETURN(r, grpo_loss_and_device_lora_grads(ctx_, *model, in, opt_.loss, static_cast<float>(scale),
                                                                 adapters, *device_lora_, acts_));
        } else {
          DC_ASSIGN_OR_RETURN(r, grpo_loss_and_lora_grads(ctx_, *model, in, opt_.loss, static_cast<float>(scale), adapters,
                                                          lora_core_.grads(), acts_,
                                                          bf16_backward(ctx_) ? &base_transposed_ : nullptr));
        }
      } else if (device_ != nullptr) {
        DC_ASSIGN_OR_RETURN(r, grpo_loss_and_device_grads(ctx_, *model, in, opt_.loss, static_cast<float>(scale), *device_,
                                                          acts_, write));
      } else {
        DC_ASSIGN_OR_RETURN(r, grpo_loss_and_grads(ctx_, *model, in, opt_.loss, static_cast<float>(scale), core_.grads(),
                                                   acts_, mixed ? &mixed_.transposed() : nullptr, write));
        DC_RETURN_IF_ERROR(core_.end_micro_batch());
      }
      s.loss += r.loss * scale, s.kl += r.kl * scale, s.clip_fraction += r.clip_fraction * scale;
    }
    if (ranks() > 1) {  // the whole round's: the ranks' parts added in rank order
      DC_ASSIGN_OR_RETURN(const std::vector<double> sum, opt_.comm->sum_doubles({s.loss, s.kl, s.clip_fraction}));
      s.loss = sum[0], s.kl = sum[1], s.clip_fraction = sum[2];
    }
    OptimizerStepStats o;
    if (device_lora_ != nullptr) {
      DC_ASSIGN_OR_RETURN(o, device_lora_->step(ctx_, lora_core_, s.loss));
    } else if (device_ != nullptr) {
      DC_ASSIGN_OR_RETURN(o, device_->step(ctx_, core_, s.loss));
    } else {
      o = lora ? lora_core_.step(ctx_, s.loss) : core_.step(ctx_, mixed ? &mixed_ : nullptr, s.loss);
    }
    const int64_t in_a_row = lora ? lora_core_.consecutive_skips() : core_.consecutive_skips();
    s.step = o.step, s.lr = o.lr, s.grad_norm = o.grad_norm, s.skipped = o.skipped;
    if (o.skipped) s.skip_note = skip_note("GRPO", o, in_a_row);
    s.round = (s.step - 1) / I, s.iteration = k;
    // ref ← (1 − α)·ref + α·policy: each rank mixes its shard, then the reference is all-gathered (LoRA: the
    // adapters' reference copy, the same on every rank)
    if (opt_.ref_sync_steps > 0 && s.step % opt_.ref_sync_steps == 0) {
      if (lora) {  // on a device: the policy's adapters downloaded, mixed on the host, the reference's copy refreshed
        DC_RETURN_IF_ERROR(sync_to_host());
        const float alpha = static_cast<float>(opt_.ref_mixup_alpha);
        const float* p = lora_core_.params().data();
        float* ref = ref_lora_.data();
        for (int64_t i = 0; i < ref_lora_.n_values(); ++i) ref[i] = (1.0f - alpha) * ref[i] + alpha * p[i];
        if (device_lora_ != nullptr && opt_.loss.beta != 0) DC_RETURN_IF_ERROR(device_lora_->refresh_reference(ctx_, *base_, ref_lora_));
      } else {  // on a device: mixed on the host (the CPU's arithmetic), the reference's device copy refreshed
        DC_RETURN_IF_ERROR(sync_to_host());
        DC_RETURN_IF_ERROR(core_.mix_into(ref_, static_cast<float>(opt_.ref_mixup_alpha)));
        if (ref_on_device_) DC_RETURN_IF_ERROR(device_->refresh_reference(ctx_, ref_));
      }
    }
    s.train_seconds = since(t1);
    s.seconds = since(t0);
    history_.push_back(s);
    DC_RETURN_IF_ERROR(write_metrics_line(s));
    if (in_a_row >= kMaxConsecutiveSkips) return too_many_skips("GRPO", o, in_a_row);
    if (s.step % I == 0 && opt_.save_every > 0 && (s.step / I) % opt_.save_every == 0 && s.step < opt_.steps &&
        !opt_.out_dir.empty())
      DC_RETURN_IF_ERROR(save());
    return s;
  } catch (const std::bad_alloc&) {
    return resource_exhausted("GRPO step " + std::to_string(steps_done() + 1) + ": out of memory; lower "
                              "--num-generations or --max-completion-length, raise --grad-accum, or use --grad-checkpointing");
  }
}

Status GrpoTrainer::sync_to_host() {
  if (device_lora_ != nullptr) return device_lora_->sync_to_host(ctx_, lora_core_);
  return device_ != nullptr ? device_->sync_to_host(ctx_, core_) : Status();
}

Status GrpoTrainer::write_metrics_line(const GrpoStepStats& s) {
  if (opt_.out_dir.empty()) return Status();
  Json j = {{"step", s.step},
            {"round", s.round},
            {"iteration", s.iteration},
            {"loss", s.loss},
            {"kl", s.kl},
            {"clip_fraction", s.clip_fraction},
            {"grad_norm", s.grad_norm},
            {"lr", s.lr},
            {"reward_mean", s.reward_mean},
            {"reward_std", s.reward_std},
            {"rollout_tokens", s.rollout_tokens},
            {"rollout_seconds", s.rollout_seconds},
            {"score_seconds", s.score_seconds},
            {"train_seconds", s.train_seconds},
            {"seconds", s.seconds}};
  for (const auto& [name, value] : s.metrics) j[name] = value;
  if (s.skipped) j["skipped"] = true;  // (its non-finite loss or norm is written as null)
  return lora() ? lora_core_.append_metrics(j.dump()) : core_.append_metrics(j.dump());
}

Status GrpoTrainer::save() {
  if (opt_.out_dir.empty()) return invalid_argument("save: the GRPO trainer has no output directory");
  if (steps_done() % opt_.num_iterations != 0)
    return invalid_argument("save: checkpoints are written at round boundaries (every --num-iterations steps)");
  DC_RETURN_IF_ERROR(sync_to_host());
  if (lora()) {  // the adapters in PEFT's layout; their reference copy beside them
    DC_RETURN_IF_ERROR(lora_core_
                           .save(opt_.out_dir, opt_.model_dir,
                                 [&](const std::string& tmp) {
                                   std::vector<TensorToWrite> ref;
                                   for (const LoraParams::Tensor& t : ref_lora_.tensors())
                                     ref.push_back({t.name, DType::kF32, t.shape, ref_lora_.data() + t.offset});
                                   return write_safetensors((fs::path(tmp) / "ref_adapter_model.safetensors").string(), ref);
                                 })
                           .status());
  } else {
    DC_RETURN_IF_ERROR(core_
                           .save(opt_.out_dir, opt_.model_dir,
                                 [&](const std::string& tmp) {
                                   return write_params_safetensors((fs::path(tmp) / "ref_model.safetensors").string(), ref_);
                                 })
                           .status());
  }
  if (rank() != 0) return Status();  // rank 0 draws the plot
  std::vector<double> steps, rewards;
  for (const GrpoStepStats& s : history_) steps.push_back(static_cast<double>(s.step)), rewards.push_back(s.reward_mean);
  const std::string svg = (fs::path(opt_.out_dir) / "reward.svg").string();
  DC_RETURN_IF_ERROR(write_text_file(svg + ".tmp", line_plot_svg("Coupled-GRPO mean reward", steps, rewards)));
  std::error_code ec;
  fs::rename(svg + ".tmp", svg, ec);
  if (ec) return io_error("cannot rename " + svg + ".tmp: " + ec.message());
  return Status();
}

}  // namespace dc::train
