// Trainer: setup (model, tokenizer, data, resume), the optimizer step, metrics and checkpoints.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <map>
#include <sstream>

#include "core/log.h"
#include "core/profiler.h"
#include "io/atomic_dir.h"
#include "gguf/model_source.h"
#include "io/checkpoint.h"
#include "ops/device.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "tokenizer/tokenizer.h"
#include "train/plot.h"
#include "train/rng.h"

namespace dc::train {
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// The forward in training mode on `batch` (with `lora`, or null), the weighted cross-entropy, and
// `backward(dlogits)` with dlogits scaled by grad_scale; `none` runs when the batch has no loss rows.
template <class Backward, class None>
Result<double> run_loss(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                        const LoraWeights* lora, Activations& acts, LossTimes* times, Backward&& backward, None&& none) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n_out = static_cast<int64_t>(batch.out_rows.size()), V = model.config().n_vocab;
  ForwardBatch fb;
  fb.n_batch = batch.n_batch;
  fb.n_seq = batch.n_seq;
  fb.tokens = batch.tokens.data();
  fb.valid = batch.valid.empty() ? nullptr : batch.valid.data();
  fb.positions = batch.positions.empty() ? nullptr : batch.positions.data();
  fb.out_rows = batch.out_rows.data();
  fb.n_out = n_out;
  fb.lora = lora;
  std::vector<float> logits(n_out * V);  // [n_out, V], becomes dlogits
  DC_RETURN_IF_ERROR(model.forward(ctx, fb, logits.data(), nullptr, &acts));
  if (n_out == 0) {
    none();
    return 0.0;
  }
  const double loss =
      cross_entropy(ctx, logits.data(), batch.targets.data(), batch.weights.data(), n_out, V, logits.data());
  const auto t1 = std::chrono::steady_clock::now();
  if (grad_scale != 1.0f)
    for (float& g : logits) g *= grad_scale;
  DC_RETURN_IF_ERROR(backward(logits.data()));
  if (times != nullptr) {
    times->forward_s = std::chrono::duration<double>(t1 - t0).count();
    times->backward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  return loss;
}

}  // namespace

Result<double> loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                              ModelParams& grads, Activations& acts, const ModelWeights* transposed, LossTimes* times,
                              GradWrite write) {
  return run_loss(
      ctx, model, batch, grad_scale, nullptr, acts, times,
      [&](const float* dlogits) { return model.backward(ctx, acts, dlogits, grads.spans(), transposed, write); },
      [&] {
        if (write == GradWrite::kOverwrite) grads.zero();
      });
}

Result<double> loss_and_lora_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                                   const LoraWeights& lora, LoraParams& grads, Activations& acts,
                                   const ModelWeights* transposed, LossTimes* times) {
  return run_loss(
      ctx, model, batch, grad_scale, &lora, acts, times,
      [&](const float* dlogits) { return model.backward_lora(ctx, acts, dlogits, lora, grads.grads(), transposed); },
      [] {});
}

namespace {

std::string options_fingerprint(const TrainOptions& o) {
  std::ostringstream os;
  os.precision(17);
  os << "data=" << o.data_path << " seq_len=" << o.seq_len << " batch=" << o.batch_size << " accum=" << o.grad_accum
     << " steps=" << o.steps << " lr=" << o.lr.lr << " sched=" << static_cast<int>(o.lr.schedule)
     << " warmup=" << o.lr.warmup_steps << " min_lr=" << o.lr.min_lr_ratio << " b1=" << o.adam.beta1
     << " b2=" << o.adam.beta2 << " eps=" << o.adam.eps << " wd=" << o.adam.weight_decay
     << " clip=" << o.max_grad_norm << " seed=" << o.seed << " t_eps=" << o.masking.eps
     << " norm=" << static_cast<int>(o.masking.norm) << " pad=" << o.pad_token_id
     << " instruct=" << o.instruct_template;
  if (o.precision == MatmulPrecision::kBF16) os << " precision=bf16";  // f32 runs keep their old fingerprint
  os << lora_fingerprint(o.lora);
  return os.str();
}

// The "key=value" fields of a fingerprint (values may hold spaces: a word without '=' continues the last).
std::vector<std::pair<std::string, std::string>> fingerprint_fields(const std::string& fingerprint) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::istringstream in(fingerprint);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0) {
      if (!fields.empty()) fields.back().second += " " + word;
    } else {
      fields.emplace_back(word.substr(0, eq), word.substr(eq + 1));
    }
  }
  return fields;
}

// Compares the saved and current options of a resumed run. Only `steps` may grow (the run is extended);
// any other difference is an error naming each option with its saved and current value.
Status compare_fingerprints(const std::string& saved, const std::string& now, const std::string& latest,
                            std::string* note) {
  const auto a = fingerprint_fields(saved), b = fingerprint_fields(now);
  std::map<std::string, std::string> was(a.begin(), a.end());
  std::string diffs;
  for (const auto& [key, value] : b) {
    const auto it = was.find(key);
    const std::string old = it == was.end() ? "(none)" : it->second;
    if (old == value) continue;
    if (key == "steps" && it != was.end() && std::atoll(value.c_str()) >= std::atoll(old.c_str())) {
      *note = "train: --steps raised from " + old + " to " + value + "; a linear or cosine learning-rate schedule "
              "is stretched to the new length from here";
      continue;
    }
    diffs += "\n  " + key + ": saved " + old + ", now " + value;
  }
  const std::map<std::string, std::string> is(b.begin(), b.end());
  for (const auto& [key, value] : a)  // an option the run had and the current one lacks (precision=bf16)
    if (is.find(key) == is.end()) diffs += "\n  " + key + ": saved " + value + ", now (none)";
  if (diffs.empty()) return Status::ok_status();
  return invalid_argument("--resume: these options differ from those of " + latest + " (pass the saved values, or "
                          "--force to start over):" + diffs);
}

OptimizerOptions optimizer_options(const TrainOptions& o) {
  return {o.lr, o.adam, o.max_grad_norm, o.comm != nullptr ? o.grad_accum / o.comm->size() : 1};  // micro-batches per rank
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& o, const Context& ctx) {
  DC_ASSIGN_OR_RETURN(const ModelConfig config, model_source_config(o.model_dir));
  DC_ASSIGN_OR_RETURN(Tokenizer tokenizer, model_source_tokenizer(o.model_dir));
  DataOptions d;
  d.seq_len = o.seq_len;
  d.instruct_template = o.instruct_template;
  if (o.pad_token_id >= 0) {
    d.pad_token_id = o.pad_token_id;
  } else {
    const auto dlm_pad = tokenizer.token_to_id("<|dlm_pad|>");
    d.pad_token_id = dlm_pad ? *dlm_pad : static_cast<int32_t>(config.pad_token_id);
  }
  if (d.pad_token_id < 0 || d.pad_token_id >= config.n_vocab)
    return invalid_argument("pad token id " + std::to_string(d.pad_token_id) + " is outside the vocabulary");
  DC_ASSIGN_OR_RETURN(Dataset data, load_dataset(o.data_path, tokenizer, d));
  return create_with_data(o, ctx, std::move(data));
}

namespace {

Status check_counts(const TrainOptions& o) {
  if (o.batch_size < 1 || o.grad_accum < 1 || o.steps < 1)
    return invalid_argument("--batch-size, --grad-accum and --steps must be at least 1");
  int64_t samples = 0;
  if (__builtin_mul_overflow(o.batch_size, o.grad_accum, &samples) || __builtin_mul_overflow(samples, o.steps, &samples))
    return invalid_argument("--batch-size × --grad-accum × --steps overflows a 64-bit count of samples");
  if (o.save_every < 0) return invalid_argument("--save-every (save_every): must be >= 0");
  DC_RETURN_IF_ERROR(check_optimizer_options(o.lr, o.adam, o.max_grad_norm));
  DC_RETURN_IF_ERROR(check_finite_in("--t-eps (masking.eps)", o.masking.eps, 0.0, 1.0, true, true));
  const int ranks = o.comm == nullptr ? 1 : o.comm->size();
  if (o.grad_accum % ranks != 0)
    return invalid_argument("--grad-accum " + std::to_string(o.grad_accum) + " is not a multiple of the " +
                            std::to_string(ranks) + " ranks: each rank runs --grad-accum / ranks micro-batches of "
                            "the global batch");
  return Status();
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create_with_data(const TrainOptions& o, const Context& ctx, Dataset data) {
  DC_RETURN_IF_ERROR(check_counts(o));
  std::unique_ptr<Trainer> t(new Trainer());
  t->opt_ = o;
  t->ctx_ = ctx;
  DC_ASSIGN_OR_RETURN(const std::string latest, checkpoint_to_resume(o.out_dir, o.resume, o.force));
  DC_RETURN_IF_ERROR(check_checkpoint_kind(latest, o.lora.r > 0));
  if (o.lora.r > 0) {  // adapters over the frozen base, read as it is stored
    DC_RETURN_IF_ERROR(check_lora_spec(o.lora));
    DC_ASSIGN_OR_RETURN(t->model_, load_model_source(o.model_dir, ctx.pool));
    t->config_ = t->model_->config();
    if (!latest.empty()) {
      DC_ASSIGN_OR_RETURN(t->lora_core_, LoraCore::resume(latest, t->config_, optimizer_options(o), o.comm));
    } else {
      t->lora_core_ = LoraCore::start(t->config_, o.lora, o.seed, optimizer_options(o), o.comm);
    }
    return finish_setup(std::move(t), std::move(data), latest);
  }
  if (!latest.empty()) {
    DC_ASSIGN_OR_RETURN(t->core_, OptimizerCore::resume(latest, optimizer_options(o), o.comm));
    t->config_ = t->core_.config();
    return finish_setup(std::move(t), std::move(data), latest);
  }
  {
    ModelConfig config;
    DC_ASSIGN_OR_RETURN(ModelParams params, load_trainable_params(o.model_dir, &config));
    t->core_ = OptimizerCore::start(config, std::move(params), optimizer_options(o), o.comm);
    t->config_ = config;
  }  // the mapped stored weights are released: training uses the f32 copies
  return finish_setup(std::move(t), std::move(data), "");
}

Result<std::unique_ptr<Trainer>> Trainer::create_with_params(const TrainOptions& o, const Context& ctx,
                                                             const ModelConfig& config, ModelParams params,
                                                             Dataset data) {
  DC_RETURN_IF_ERROR(check_counts(o));
  if (o.resume) return invalid_argument("--resume needs the model directory's weights, not weights in memory");
  std::unique_ptr<Trainer> t(new Trainer());
  t->opt_ = o;
  t->ctx_ = ctx;
  t->config_ = config;
  if (o.lora.r > 0) {  // the weights in memory are the frozen base
    auto storage = std::make_shared<ModelParams>(std::move(params));
    return create_with_model(o, ctx, Model::from_weights(config, storage->weights(), storage), std::move(data));
  }
  t->core_ = OptimizerCore::start(config, std::move(params), optimizer_options(o), o.comm);
  return finish_setup(std::move(t), std::move(data), "");
}

Result<std::unique_ptr<Trainer>> Trainer::create_with_model(const TrainOptions& o, const Context& ctx,
                                                            std::unique_ptr<Model> base, Dataset data) {
  DC_RETURN_IF_ERROR(check_counts(o));
  if (o.lora.r <= 0) return invalid_argument("create_with_model trains LoRA adapters over the model: set --lora-r");
  if (o.resume) return invalid_argument("--resume needs the model directory's weights, not weights in memory");
  DC_RETURN_IF_ERROR(check_lora_spec(o.lora));
  std::unique_ptr<Trainer> t(new Trainer());
  t->opt_ = o;
  t->ctx_ = ctx;
  t->config_ = base->config();
  t->model_ = std::move(base);
  t->lora_core_ = LoraCore::start(t->config_, o.lora, o.seed, optimizer_options(o), o.comm);
  return finish_setup(std::move(t), std::move(data), "");
}

Result<std::unique_ptr<Trainer>> Trainer::finish_setup(std::unique_ptr<Trainer> t, Dataset data,
                                                       const std::string& latest) {
  if (t->ctx_.device != Device::kCpu)
    set_device_training_precision(t->ctx_, &t->opt_.precision);
  t->ctx_.matmul_precision = t->opt_.precision;
  if (t->opt_.precision == MatmulPrecision::kBF16 && !bf16_backward(t->ctx_)) {
    dc::log(LogLevel::kWarning, "this CPU has no AVX512_BF16 (or reference kernels are on): training in f32");
    t->ctx_.matmul_precision = MatmulPrecision::kF32;
    t->opt_.precision = MatmulPrecision::kF32;
  }
  const TrainOptions& o = t->opt_;
  t->ctx_.workspace = &t->workspace_;  // the steps' scratch is this trainer's, released with it
  TrainState& state = t->state();
  const std::string options = options_fingerprint(t->opt_);
  if (latest.empty()) {
    state.seed = o.seed;
  } else {
    DC_RETURN_IF_ERROR(compare_fingerprints(state.options, options, latest, &t->resume_note_));
    DC_RETURN_IF_ERROR(check_resumed_state(latest, state, {o.steps, 1, o.grad_accum * o.batch_size, o.seed}));
  }
  state.options = options;  // the next checkpoint records the current --steps
  const ModelConfig& config = t->config_;

  for (const TrainSequence& seq : data.sequences)
    if (static_cast<int64_t>(seq.tokens.size()) != o.seq_len)
      return invalid_argument("training data: a sequence of " + std::to_string(seq.tokens.size()) +
                              " tokens; --seq-len is " + std::to_string(o.seq_len));
  if (data.sequences.empty()) return invalid_argument("training data: no sequences");
  t->data_ = std::move(data);
  t->acts_.recompute = o.recompute;
  t->order_ = std::make_unique<DataOrder>(static_cast<int64_t>(t->data_.sequences.size()), o.seed);
  t->opt_.masking.mask_token_id = static_cast<int32_t>(config.mask_token_id);
  if (config.mask_token_id < 0 || config.mask_token_id >= config.n_vocab)
    return invalid_argument("config.json mask_token_id is outside the vocabulary");

  if (o.out_dir.empty()) return t;  // nothing written (benchmarks)
  std::vector<std::string> kept;
  DC_RETURN_IF_ERROR(t->open_metrics(&kept));
  for (const std::string& line : kept) {  // the curve of the steps already done
    try {
      const Json j = Json::parse(line);
      StepStats s;
      auto number = [&](const char* key) { return j.at(key).is_null() ? std::nan("") : j.at(key).get<double>(); };
      s.step = j.at("step"), s.loss = number("loss"), s.lr = j.at("lr"), s.grad_norm = number("grad_norm");
      s.tokens = j.at("tokens"), s.seconds = j.at("seconds");
      t->history_.push_back(s);
    } catch (const std::exception&) {
      continue;  // not a line this trainer wrote
    }
  }
  return t;
}

Status Trainer::write_metrics_line(const StepStats& s) {
  Json j = {{"step", s.step},           {"loss", s.loss},       {"lr", s.lr},
            {"grad_norm", s.grad_norm}, {"tokens", s.tokens},   {"seconds", s.seconds},
            {"tokens_per_s", s.seconds > 0 ? s.tokens / s.seconds : 0.0}};
  if (s.skipped) j["skipped"] = true;  // (its non-finite loss or norm is written as null)
  return opt_.lora.r > 0 ? lora_core_.append_metrics(j.dump()) : core_.append_metrics(j.dump());
}

Status Trainer::open_metrics(std::vector<std::string>* kept) {
  DC_ASSIGN_OR_RETURN(*kept, opt_.lora.r > 0 ? lora_core_.open_metrics(opt_.out_dir) : core_.open_metrics(opt_.out_dir));
  return Status();
}


Result<StepStats> Trainer::step() {
  try {
    return step_or_throw();
  } catch (const std::bad_alloc&) {  // the logits of the loss rows, the masked batch, the metrics
    return resource_exhausted("train step " + std::to_string(steps_done() + 1) + ": out of memory (batch " +
                              std::to_string(opt_.batch_size) + " × " + std::to_string(opt_.seq_len) +
                              " tokens); lower --batch-size or --seq-len, or use --grad-checkpointing");
  }
}

Result<StepStats> Trainer::step_or_throw() {
  const auto t0 = std::chrono::steady_clock::now();
  StepStats s;
  const bool lora = opt_.lora.r > 0;
  const bool mixed = !lora && ctx_.matmul_precision == MatmulPrecision::kBF16;  // LoRA: the base is read as stored
  if (lora && lora_transposed_.layers.empty()) lora_transposed_ = pack_frozen_base(ctx_, *model_);
  if (mixed) {  // this step's bf16 copies, in the same buffers every step
    DC_RETURN_IF_ERROR(mixed_.refresh(ctx_, core_.params().weights()));
    s.relayout_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Views of the master weights (and their bf16 copies), which AdamW updates in place: built once.
  if (model_ == nullptr)
    model_ = Model::from_weights(core_.config(), mixed ? mixed_.forward() : core_.params().weights(), nullptr);
  const bool device = ctx_.device != Device::kCpu;
  if (device && device_ == nullptr && device_lora_ == nullptr) {  // a micro-batch: batch_size rows of seq_len, any a loss row
    DeviceBatchShape batch;
    batch.positions = batch.loss_rows = opt_.batch_size * opt_.seq_len;
    batch.recompute = opt_.recompute;
    batch.smaller_batch = "a smaller --batch-size (with a larger --grad-accum for the same batch) or --seq-len";
    if (lora) {
      DC_ASSIGN_OR_RETURN(device_lora_, DeviceLoraTraining::start(ctx_, *model_, lora_core_, batch));
    } else {
      DC_ASSIGN_OR_RETURN(device_, DeviceTraining::start(ctx_, *model_, &core_, batch));
    }
  }
  if (device && lora) DC_RETURN_IF_ERROR(device_lora_->grads().zero(ctx_));  // the backwards add
  else if (lora) lora_core_.begin_step();  // zeroes the adapters' gradients; the backwards add
  else core_.begin_step(mixed ? &mixed_ : nullptr);  // no zeroing: the first micro-batch writes the gradients
  TrainState& state = this->state();
  const float scale = 1.0f / static_cast<float>(opt_.grad_accum);
  // This rank's contiguous run of the global batch's micro-batches (all of them in one process).
  const int rank = opt_.comm == nullptr ? 0 : opt_.comm->rank(), ranks = opt_.comm == nullptr ? 1 : opt_.comm->size();
  const int64_t per_rank = opt_.grad_accum / ranks, first = state.cursor;
  for (int64_t micro = rank * per_rank; micro < (rank + 1) * per_rank; ++micro) {
    std::vector<TrainSequence> seqs;
    for (int64_t i = 0; i < opt_.batch_size; ++i)
      seqs.push_back(data_.sequences[order_->sample_at(first + micro * opt_.batch_size + i)]);
    const uint64_t key = hash_counters(state.seed, 0x6d61736b, static_cast<uint64_t>(state.step * opt_.grad_accum + micro));
    MaskedBatch batch;
    {
      const ProfileScope profile(ctx_, "masking");
      DC_ASSIGN_OR_RETURN(batch, make_masked_batch(seqs, opt_.masking, key, config_.n_vocab));
    }
    const auto t_fwd = std::chrono::steady_clock::now();
    LossTimes times;
    // The first micro-batch writes the gradients (no zeroing pass over them), the others add.
    const GradWrite write = micro == rank * per_rank ? GradWrite::kOverwrite : GradWrite::kAdd;
    double loss = 0;
    if (lora) {  // the adapters' dropout draws a fresh mask per micro-batch
      LoraWeights adapters = lora_core_.params().weights();
      adapters.dropout_key = hash_counters(state.seed, 0x6c6f7261, static_cast<uint64_t>(state.step * opt_.grad_accum + micro));
      if (device) {
        DC_ASSIGN_OR_RETURN(loss, device_lora_loss_and_grads(ctx_, *model_, batch, scale, adapters, acts_, &times, *device_lora_));
      } else {
        DC_ASSIGN_OR_RETURN(loss, loss_and_lora_grads(ctx_, *model_, batch, scale, adapters, lora_core_.grads(), acts_,
                                                      bf16_backward(ctx_) ? &lora_transposed_ : nullptr, &times));
      }
    } else if (device) {
      DC_ASSIGN_OR_RETURN(loss, device_loss_and_grads(ctx_, *model_, batch, scale, acts_, write, &times, *device_));
    } else {
      DC_ASSIGN_OR_RETURN(loss, loss_and_grads(ctx_, *model_, batch, scale, core_.grads(), acts_,
                                               mixed ? &mixed_.transposed() : nullptr, &times, write));
      DC_RETURN_IF_ERROR(core_.end_micro_batch());
    }
    s.fwd_bwd_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fwd).count();
    s.forward_seconds += times.forward_s;
    s.backward_seconds += times.backward_s;
    s.loss += loss / static_cast<double>(opt_.grad_accum);
    s.tokens += batch.n_batch * batch.n_seq;
    s.loss_rows += static_cast<int64_t>(batch.out_rows.size());
  }
  state.cursor = first + opt_.grad_accum * opt_.batch_size;
  if (ranks > 1) {  // the global batch's loss and counts: the ranks' parts added in rank order
    DC_ASSIGN_OR_RETURN(const std::vector<double> sum,
                        opt_.comm->sum_doubles({s.loss, static_cast<double>(s.tokens), static_cast<double>(s.loss_rows)}));
    s.loss = sum[0], s.tokens = static_cast<int64_t>(sum[1]), s.loss_rows = static_cast<int64_t>(sum[2]);
  }
  const auto t_opt = std::chrono::steady_clock::now();
  OptimizerStepStats o;
  if (device && lora) {
    DC_ASSIGN_OR_RETURN(o, device_lora_->step(ctx_, lora_core_, s.loss));
  } else if (device) {
    DC_ASSIGN_OR_RETURN(o, device_->step(ctx_, core_, s.loss));
  } else {
    o = lora ? lora_core_.step(ctx_, s.loss) : core_.step(ctx_, mixed ? &mixed_ : nullptr, s.loss);
  }
  const int64_t in_a_row = lora ? lora_core_.consecutive_skips() : core_.consecutive_skips();
  s.optimizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
  s.step = o.step, s.lr = o.lr, s.grad_norm = o.grad_norm, s.skipped = o.skipped;
  if (o.skipped) s.skip_note = skip_note("train", o, in_a_row);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  history_.push_back(s);
  DC_RETURN_IF_ERROR(write_metrics_line(s));
  if (in_a_row >= kMaxConsecutiveSkips) return too_many_skips("train", o, in_a_row);
  if (opt_.save_every > 0 && s.step % opt_.save_every == 0 && s.step < opt_.steps && !opt_.out_dir.empty())
    DC_RETURN_IF_ERROR(save());
  return s;
}

Status Trainer::save() {
  if (opt_.out_dir.empty()) return invalid_argument("save: the trainer has no output directory (TrainOptions::out_dir)");
  if (opt_.model_dir.empty()) return invalid_argument("save: the trainer has no model directory to copy the config from");
  DC_RETURN_IF_ERROR(sync_to_host());
  if (opt_.lora.r > 0) DC_RETURN_IF_ERROR(lora_core_.save(opt_.out_dir, opt_.model_dir).status());
  else DC_RETURN_IF_ERROR(core_.save(opt_.out_dir, opt_.model_dir).status());
  if (opt_.comm != nullptr && opt_.comm->rank() != 0) return Status();  // rank 0 draws the plot
  const std::string svg = (fs::path(opt_.out_dir) / "loss.svg").string();
  DC_RETURN_IF_ERROR(write_text_file(svg + ".tmp", loss_plot_svg(history_)));
  std::error_code ec;
  fs::rename(svg + ".tmp", svg, ec);
  if (ec) return io_error("cannot rename " + svg + ".tmp: " + ec.message());
  return Status();
}

Status Trainer::sync_to_host() {
  if (device_lora_ != nullptr) return device_lora_->sync_to_host(ctx_, lora_core_);
  return device_ != nullptr ? device_->sync_to_host(ctx_, core_) : Status();
}

std::string loss_plot_svg(const std::vector<StepStats>& history) {
  std::vector<double> steps, losses;
  for (const StepStats& s : history)
    if (std::isfinite(s.loss)) steps.push_back(static_cast<double>(s.step)), losses.push_back(s.loss);  // not skipped ones
  return line_plot_svg("masked-diffusion training loss", steps, losses);
}

}  // namespace dc::train
