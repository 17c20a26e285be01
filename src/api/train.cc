// The public facade's Trainer (include/diffucoder/diffucoder.h) over train::Trainer.
#include <diffucoder/diffucoder.h>

#include "api/status_convert.h"
#include "core/thread_pool.h"
#include "train/trainer.h"

namespace diffucoder {

struct Trainer::Impl {
  std::unique_ptr<dc::ThreadPool> pool;  // before the trainer, which keeps a Context pointing at it
  std::unique_ptr<dc::train::Trainer> trainer;
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& c) {
  return dc::api::to_public([&]() -> dc::Result<std::unique_ptr<Trainer>> {
    if (c.threads > dc::kMaxThreads)
      return dc::invalid_argument("threads: at most " + std::to_string(dc::kMaxThreads) + ", got " +
                                  std::to_string(c.threads));
    if (c.seq_len < 1 || c.batch_size < 1 || c.grad_accum < 1 || c.steps < 1 || c.batch_size * c.seq_len > (int64_t{1} << 24))
      return dc::invalid_argument("seq_len, batch_size, grad_accum and steps must be at least 1, and batch_size × seq_len "
                                  "at most 16777216 tokens");
    if (c.precision != "bf16" && c.precision != "f32")
      return dc::invalid_argument("precision: \"bf16\" or \"f32\", got \"" + c.precision + "\"");
    dc::train::TrainOptions o;
    o.model_dir = c.model_dir, o.data_path = c.data_path, o.out_dir = c.out_dir;
    o.instruct_template = c.instruct_template;
    o.seq_len = c.seq_len, o.batch_size = c.batch_size, o.grad_accum = c.grad_accum, o.steps = c.steps;
    DC_ASSIGN_OR_RETURN(o.lr.schedule, dc::train::parse_lr_schedule(c.lr_schedule));
    o.lr.lr = c.lr, o.lr.min_lr_ratio = c.min_lr_ratio, o.lr.warmup_steps = c.warmup_steps, o.lr.total_steps = c.steps;
    o.adam.weight_decay = c.weight_decay;
    o.max_grad_norm = c.max_grad_norm;
    o.precision = c.precision == "f32" ? dc::MatmulPrecision::kF32 : dc::MatmulPrecision::kBF16;
    o.recompute = c.grad_checkpointing;
    o.resume = c.resume, o.force = c.force, o.seed = c.seed;
    auto impl = std::make_unique<Impl>();
    impl->pool = std::make_unique<dc::ThreadPool>(c.threads);
    dc::Context ctx;
    ctx.pool = impl->pool.get();
    DC_ASSIGN_OR_RETURN(impl->trainer, dc::train::Trainer::create(o, ctx));
    return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
  }());
}

Result<TrainStepStats> Trainer::step() {
  dc::Result<dc::train::StepStats> r = impl_->trainer->step();
  if (!r.ok()) return dc::api::to_public(r.status());
  const dc::train::StepStats& s = *r;
  return TrainStepStats{s.step, s.loss, s.lr, s.grad_norm, s.tokens, s.seconds};
}

Status Trainer::save() { return dc::api::to_public(impl_->trainer->save()); }
int64_t Trainer::steps_done() const { return impl_->trainer->steps_done(); }
std::string Trainer::precision() const {
  return impl_->trainer->precision() == dc::MatmulPrecision::kBF16 ? "bf16" : "f32";
}

}  // namespace diffucoder
