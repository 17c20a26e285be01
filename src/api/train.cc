// The public facade's Trainer (include/diffucoder/diffucoder.h) over train::Trainer: TrainConfig checked
// field by field and turned into train::TrainOptions, the ranks' communicator from Ranks (api/ranks.h).
#include <diffucoder/diffucoder.h>

#include <algorithm>

#include "api/ranks.h"
#include "api/status_convert.h"
#include "api/train_shared.h"
#include "core/thread_pool.h"
#include "train/trainer.h"

namespace diffucoder {

struct Trainer::Impl {
  std::unique_ptr<dc::ThreadPool> pool;  // before the trainer, which keeps a Context pointing at it
  std::unique_ptr<dc::train::Trainer> trainer;
  dc::dist::Comm* comm = nullptr;        // TrainConfig::ranks' (null: this process alone)
  int64_t steps_here = 0;                // step() calls that succeeded in this process
};

namespace {

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
  DC_RETURN_IF_ERROR(dc::api::check_optimizer_fields(
      {c.lr, c.min_lr_ratio, c.weight_decay, c.max_grad_norm, c.beta1, c.beta2, c.adam_eps}));
  DC_RETURN_IF_ERROR(dc::api::check_number(c.t_eps >= 1e-9 && c.t_eps <= 0.999, "t_eps", "in [1e-9, 0.999]", c.t_eps));
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
    DC_ASSIGN_OR_RETURN(o.lora, dc::api::lora_spec(c.lora_r, c.lora_alpha, c.lora_targets, c.lora_dropout));
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
  return dc::api::to_public(dc::api::gather_rank_stats(impl_->comm, impl_->trainer->footprint(), impl_->steps_here));
}

}  // namespace diffucoder
