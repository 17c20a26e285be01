// The public facade's Trainer (include/diffucoder/diffucoder.h) over train::Trainer: TrainConfig checked
// field by field and turned into train::TrainOptions, the ranks' communicator from Ranks (api/ranks.h).
#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <cmath>

#include "api/ranks.h"
#include "api/status_convert.h"
#include "core/number_text.h"
#include "core/peak_rss.h"
#include "core/thread_pool.h"
#include "lora/trainable.h"
#include "train/trainer.h"

namespace diffucoder {

struct Trainer::Impl {
  std::unique_ptr<dc::ThreadPool> pool;  // before the trainer, which keeps a Context pointing at it
  std::unique_ptr<dc::train::Trainer> trainer;
  dc::dist::Comm* comm = nullptr;        // TrainConfig::ranks' (null: this process alone)
  int64_t steps_here = 0;                // step() calls that succeeded in this process
};

namespace {

// "field: must be <rule>, got <value>" when a number breaks its rule (NaN breaks every rule).
dc::Status check_train_number(bool ok, const char* field, const char* rule, double value) {
  if (ok) return dc::Status();
  return dc::invalid_argument(std::string(field) + ": must be " + rule + ", got " + dc::number_text(value));
}

dc::Status check_train_config(const TrainConfig& c) {
  if (c.threads > dc::kMaxThreads)
    return dc::invalid_argument("threads: at most " + std::to_string(dc::kMaxThreads) + ", got " +
                                std::to_string(c.threads));
  if (c.seq_len < 1 || c.batch_size < 1 || c.grad_accum < 1 || c.steps < 1 || c.batch_size * c.seq_len > (int64_t{1} << 24))
    return dc::invalid_argument("seq_len, batch_size, grad_accum and steps must be at least 1, and batch_size × seq_len "
                                "at most 16777216 tokens");
  if (c.precision != "bf16" && c.precision != "f32")
    return dc::invalid_argument("precision: \"bf16\" or \"f32\", got \"" + c.precision + "\"");
  if (c.loss_norm != "tokens" && c.loss_norm != "sequences")
    return dc::invalid_argument("loss_norm: \"tokens\" or \"sequences\", got \"" + c.loss_norm + "\"");
  DC_RETURN_IF_ERROR(check_train_number(c.lr >= 0, "lr", "at least 0", c.lr));
  DC_RETURN_IF_ERROR(check_train_number(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1, "min_lr_ratio", "in [0, 1]", c.min_lr_ratio));
  DC_RETURN_IF_ERROR(check_train_number(c.weight_decay >= 0, "weight_decay", "at least 0", c.weight_decay));
  DC_RETURN_IF_ERROR(check_train_number(c.max_grad_norm >= 0, "max_grad_norm", "at least 0 (0: no clipping)", c.max_grad_norm));
  // A beta of 1 divides by 1 − β^t = 0 in AdamW's bias correction (NaN weights).
  DC_RETURN_IF_ERROR(check_train_number(c.beta1 >= 0 && c.beta1 < 1, "beta1", "in [0, 1)", c.beta1));
  DC_RETURN_IF_ERROR(check_train_number(c.beta2 >= 0 && c.beta2 < 1, "beta2", "in [0, 1)", c.beta2));
  DC_RETURN_IF_ERROR(check_train_number(c.adam_eps > 0 && std::isfinite(c.adam_eps), "adam_eps", "above 0 and finite", c.adam_eps));
  DC_RETURN_IF_ERROR(check_train_number(c.t_eps >= 1e-9 && c.t_eps <= 0.999, "t_eps", "in [1e-9, 0.999]", c.t_eps));
  if (c.warmup_steps < 0)
    return dc::invalid_argument("warmup_steps: must be at least 0, got " + std::to_string(c.warmup_steps));
  if (c.save_every < 0)
    return dc::invalid_argument("save_every: must be at least 0 (0: only save()), got " + std::to_string(c.save_every));
  return dc::Status();
}

}  // namespace

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& c) {
  return dc::api::to_public([&]() -> dc::Result<std::unique_ptr<Trainer>> {
    DC_RETURN_IF_ERROR(check_train_config(c));
    dc::train::TrainOptions o;
    o.model_dir = c.model_dir, o.data_path = c.data_path, o.out_dir = c.out_dir;
    o.instruct_template = c.instruct_template;
    o.seq_len = c.seq_len, o.batch_size = c.batch_size, o.grad_accum = c.grad_accum, o.steps = c.steps;
    DC_ASSIGN_OR_RETURN(o.lr.schedule, dc::train::parse_lr_schedule(c.lr_schedule));
    o.lr.lr = c.lr, o.lr.min_lr_ratio = c.min_lr_ratio, o.lr.warmup_steps = c.warmup_steps, o.lr.total_steps = c.steps;
    o.adam.beta1 = c.beta1, o.adam.beta2 = c.beta2, o.adam.eps = c.adam_eps, o.adam.weight_decay = c.weight_decay;
    o.max_grad_norm = c.max_grad_norm;
    o.masking.eps = c.t_eps;
    o.masking.norm = c.loss_norm == "sequences" ? dc::train::LossNorm::kSequences : dc::train::LossNorm::kTokens;
    o.pad_token_id = std::max(c.pad_token_id, -1);
    o.precision = c.precision == "f32" ? dc::MatmulPrecision::kF32 : dc::MatmulPrecision::kBF16;
    o.recompute = c.grad_checkpointing;
    if (c.lora_r != 0) {
      o.lora.r = c.lora_r, o.lora.alpha = c.lora_alpha, o.lora.dropout = static_cast<float>(c.lora_dropout);
      DC_ASSIGN_OR_RETURN(o.lora.targets, dc::parse_lora_targets(c.lora_targets));
      DC_RETURN_IF_ERROR(dc::check_lora_spec(o.lora));
    }
    o.save_every = c.save_every;
    o.resume = c.resume, o.force = c.force, o.seed = c.seed;
    auto impl = std::make_unique<Impl>();
    if (c.ranks != nullptr && c.ranks->size() > 1) impl->comm = c.ranks->impl_->comm.get();
    o.comm = impl->comm;
    impl->pool = std::make_unique<dc::ThreadPool>(c.threads);
    dc::Context ctx;
    ctx.pool = impl->pool.get();
    DC_ASSIGN_OR_RETURN(impl->trainer, dc::train::Trainer::create(o, ctx));
    return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
  }());
}

namespace {

TrainStepStats to_public_stats(const dc::train::StepStats& s) {
  TrainStepStats p;
  p.step = s.step, p.loss = s.loss, p.lr = s.lr, p.grad_norm = s.grad_norm, p.tokens = s.tokens, p.seconds = s.seconds;
  p.loss_rows = s.loss_rows, p.skipped = s.skipped, p.skip_note = s.skip_note;
  return p;
}

}  // namespace

Result<TrainStepStats> Trainer::step() {
  dc::Result<dc::train::StepStats> r = impl_->trainer->step();
  if (!r.ok()) return dc::api::to_public(r.status());
  ++impl_->steps_here;
  return to_public_stats(*r);
}

Status Trainer::save() { return dc::api::to_public(impl_->trainer->save()); }
int64_t Trainer::steps_done() const { return impl_->trainer->steps_done(); }
std::string Trainer::precision() const {
  return impl_->trainer->precision() == dc::MatmulPrecision::kBF16 ? "bf16" : "f32";
}

TrainDataCounts Trainer::data_counts() const {
  const dc::train::Dataset& d = impl_->trainer->dataset();
  return {static_cast<int64_t>(d.sequences.size()), d.n_skipped, d.n_truncated};
}

std::string Trainer::resume_note() const { return impl_->trainer->resume_note(); }
int64_t Trainer::skipped_steps() const { return impl_->trainer->footprint().skipped_steps; }

std::vector<TrainStepStats> Trainer::history() const {
  std::vector<TrainStepStats> out;
  out.reserve(impl_->trainer->history().size());
  for (const dc::train::StepStats& s : impl_->trainer->history()) out.push_back(to_public_stats(s));
  return out;
}

Result<std::vector<TrainRankStats>> Trainer::gather_rank_stats() {
  const dc::train::TrainFootprint held = impl_->trainer->footprint();
  TrainRankStats mine;
  mine.peak_rss_bytes = dc::peak_rss_bytes();
  mine.master_weight_bytes = held.master_weight_bytes;
  mine.optimizer_state_bytes = held.optimizer_state_bytes;
  mine.gradient_bytes = held.gradient_bytes;
  dc::dist::Comm* comm = impl_->comm;
  if (comm == nullptr) return std::vector<TrainRankStats>{mine};
  mine.bytes_sent_per_step =
      static_cast<double>(comm->bytes_sent()) / static_cast<double>(std::max<int64_t>(1, impl_->steps_here));
  // As doubles, the one gather the communicator has (byte counts stay exact below 2^53).
  constexpr int kFields = 5;
  const double values[kFields] = {static_cast<double>(mine.peak_rss_bytes), static_cast<double>(mine.master_weight_bytes),
                                  static_cast<double>(mine.optimizer_state_bytes),
                                  static_cast<double>(mine.gradient_bytes), mine.bytes_sent_per_step};
  std::vector<double> all(static_cast<size_t>(kFields) * static_cast<size_t>(comm->size()));
  if (dc::Status s = comm->all_gather_doubles(values, kFields, all.data()); !s.ok()) return dc::api::to_public(s);
  std::vector<TrainRankStats> out;
  for (int r = 0; r < comm->size(); ++r) {
    const double* v = &all[static_cast<size_t>(kFields) * static_cast<size_t>(r)];
    out.push_back({static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2]),
                   static_cast<int64_t>(v[3]), v[4]});
  }
  return out;
}

}  // namespace diffucoder
