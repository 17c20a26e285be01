// The public facade's Trainer (include/diffucoder/diffucoder.h) over train::Trainer: TrainConfig checked
// field by field and turned into train::TrainOptions, the ranks' communicator from Ranks (api/ranks.h), the
// benchmarking aids (a synthetic model, random sequences) and measure.h's create_trainer with a profiler.
#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <random>

#include "api/measure.h"
#include "api/model_impl.h"
#include "api/ranks.h"
#include "api/status_convert.h"
#include "api/synthetic.h"
#include "api/train_shared.h"
#include "core/thread_pool.h"
#include "gguf/model_source.h"
#include "model/params.h"
#include "ops/device.h"
#include "train/trainer.h"

namespace diffucoder {

struct Trainer::Impl {
  std::unique_ptr<dc::ThreadPool> pool;  // before the trainer, which keeps a Context pointing at it
  std::unique_ptr<dc::DeviceBackend> backend;  // TrainConfig::device's (null: the CPU); before the trainer too
  std::unique_ptr<dc::train::Trainer> trainer;
  dc::dist::Comm* comm = nullptr;        // TrainConfig::ranks' (null: this process alone)
  int64_t steps_here = 0;                // step() calls that succeeded in this process
  ModelInfo info;
  int64_t parameters = 0;                // count_values of the model's config

  // Trainer::create, with the steps' ops timed into *profiler (null: none).
  static Result<std::unique_ptr<Trainer>> create(const TrainConfig& c, dc::Profiler* profiler);
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

// The benchmarking aids: synthetic, random_sequences, random_prompt_len, mask_ratio.
dc::Status check_benchmark_fields(const TrainConfig& c) {
  DC_RETURN_IF_ERROR(dc::api::check_number(c.mask_ratio == 0 || (c.mask_ratio > 0 && c.mask_ratio <= 1), "mask_ratio",
                                           "0 (t ~ U(t_eps, 1)) or in (0, 1]", c.mask_ratio));
  if (c.random_sequences < 0 || c.random_sequences > (int64_t{1} << 24) ||
      c.random_sequences * c.seq_len > (int64_t{1} << 32))
    return dc::invalid_argument("random_sequences: must be in [0, 16777216] and × seq_len at most 2^32 tokens, got " +
                                std::to_string(c.random_sequences));
  if (c.random_prompt_len < 0 || c.random_prompt_len >= c.seq_len)
    return dc::invalid_argument("random_prompt_len: must be in [0, seq_len = " + std::to_string(c.seq_len) + "), got " +
                                std::to_string(c.random_prompt_len));
  if (c.random_sequences > 0 && !c.data_path.empty())
    return dc::invalid_argument("random_sequences: give data_path or random_sequences, not both");
  if (!c.synthetic) return dc::Status();
  if (!c.model_dir.empty())
    return dc::invalid_argument("synthetic: a synthetic model has no model_dir (got '" + c.model_dir + "')");
  if (c.random_sequences == 0)
    return dc::invalid_argument("synthetic: needs random_sequences (a synthetic model has no tokenizer for data_path)");
  if (!c.out_dir.empty() || c.resume)
    return dc::invalid_argument("synthetic: no out_dir or resume (a synthetic model's run has no files to save)");
  if (c.synthetic->weights != "bf16" && c.lora_r == 0)
    return dc::invalid_argument("synthetic.weights: '" + c.synthetic->weights + "' weights train only as a frozen LoRA "
                                "base (set lora_r)");
  return dc::Status();
}

// c.random_sequences sequences of seq_len ids drawn from c.seed, below min(n_vocab, 150000) and never the mask
// id; the first random_prompt_len of each the prompt (loss_mask 0).
dc::Result<dc::train::Dataset> random_sequences(const TrainConfig& c, const dc::ModelConfig& config) {
  if (config.mask_token_id < 0 || config.mask_token_id >= config.n_vocab)
    return dc::invalid_argument("config mask_token_id is outside the vocabulary");
  std::mt19937 gen(static_cast<uint32_t>(c.seed));
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(std::min<int64_t>(config.n_vocab, 150000) - 1));
  dc::train::Dataset data;
  data.sequences.resize(static_cast<size_t>(c.random_sequences));
  for (dc::train::TrainSequence& s : data.sequences) {
    s.tokens.resize(c.seq_len);
    for (int32_t& t : s.tokens) {
      do t = id(gen); while (t == config.mask_token_id);
    }
    s.loss_mask.assign(c.seq_len, 1);
    std::fill_n(s.loss_mask.begin(), c.random_prompt_len, uint8_t{0});
  }
  return data;
}

// The internal trainer of `c`: over model_dir and data_path as `diffucoder train`, or over the benchmarking aids
// (a synthetic model, random sequences).
dc::Result<std::unique_ptr<dc::train::Trainer>> make_trainer(const TrainConfig& c, const dc::train::TrainOptions& o,
                                                             const dc::Context& ctx) {
  if (c.random_sequences == 0) return dc::train::Trainer::create(o, ctx);
  if (!c.synthetic) {
    DC_ASSIGN_OR_RETURN(const dc::ModelConfig config, dc::model_source_config(c.model_dir));
    DC_ASSIGN_OR_RETURN(dc::train::Dataset data, random_sequences(c, config));
    return dc::train::Trainer::create_with_data(o, ctx, std::move(data));
  }
  DC_ASSIGN_OR_RETURN(const dc::ModelConfig config, dc::api::synthetic_config(*c.synthetic));
  DC_ASSIGN_OR_RETURN(dc::train::Dataset data, random_sequences(c, config));
  DC_ASSIGN_OR_RETURN(std::unique_ptr<dc::Model> model, dc::api::synthetic_model(*c.synthetic, config, ctx.pool));
  if (c.lora_r > 0) return dc::train::Trainer::create_with_model(o, ctx, std::move(model), std::move(data));
  DC_ASSIGN_OR_RETURN(dc::ModelParams params, dc::ModelParams::from_weights(config, model->weights()));
  model.reset();  // the bf16 draw, once widened
  return dc::train::Trainer::create_with_params(o, ctx, config, std::move(params), std::move(data));
}

}  // namespace

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainConfig& c) { return Impl::create(c, nullptr); }

Result<std::unique_ptr<Trainer>> Trainer::Impl::create(const TrainConfig& c, dc::Profiler* profiler) {
  return dc::api::to_public([&]() -> dc::Result<std::unique_ptr<Trainer>> {
    DC_RETURN_IF_ERROR(check_train_config(c));
    DC_RETURN_IF_ERROR(check_benchmark_fields(c));
    dc::train::TrainOptions o;
    o.model_dir = c.model_dir, o.data_path = c.data_path, o.out_dir = c.out_dir;
    o.instruct_template = c.instruct_template;
    o.seq_len = c.seq_len, o.batch_size = c.batch_size, o.grad_accum = c.grad_accum, o.steps = c.steps;
    DC_ASSIGN_OR_RETURN(o.lr.schedule, dc::train::parse_lr_schedule(c.lr_schedule));
    o.lr.lr = c.lr, o.lr.min_lr_ratio = c.min_lr_ratio, o.lr.warmup_steps = c.warmup_steps, o.lr.total_steps = c.steps;
    o.adam.beta1 = c.beta1, o.adam.beta2 = c.beta2, o.adam.eps = c.adam_eps, o.adam.weight_decay = c.weight_decay;
    o.max_grad_norm = c.max_grad_norm;
    o.masking.eps = c.t_eps;
    if (c.mask_ratio > 0) o.masking.fixed_t.assign(c.batch_size, c.mask_ratio);
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
    ctx.profiler = profiler;
    DC_RETURN_IF_ERROR(dc::api::open_rank_device(c.device, impl->comm, &impl->backend, &ctx));
    DC_ASSIGN_OR_RETURN(impl->trainer, make_trainer(c, o, ctx));
    const dc::ModelConfig& config = impl->trainer->config();
    impl->info = dc::api::model_info(config);
    impl->info.precision = impl->trainer->precision() == dc::MatmulPrecision::kBF16 ? "bf16" : "f32";
    impl->info.threads = impl->pool->n_threads();
    if (impl->backend != nullptr) impl->info.device = impl->backend->name();
    impl->parameters = dc::api::count_values(config);
    return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
  }());
}

namespace {

TrainStepStats to_public_stats(const dc::train::StepStats& s) {
  TrainStepStats p;
  p.step = s.step, p.loss = s.loss, p.lr = s.lr, p.grad_norm = s.grad_norm, p.tokens = s.tokens, p.seconds = s.seconds;
  p.loss_rows = s.loss_rows, p.skipped = s.skipped, p.skip_note = s.skip_note;
  p.forward_backward_seconds = s.fwd_bwd_seconds, p.forward_seconds = s.forward_seconds;
  p.backward_seconds = s.backward_seconds, p.optimizer_seconds = s.optimizer_seconds;
  p.relayout_seconds = s.relayout_seconds;
  p.masking_seconds = std::max(0.0, s.seconds - s.fwd_bwd_seconds - s.optimizer_seconds);
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

const ModelInfo& Trainer::info() const { return impl_->info; }
int64_t Trainer::parameters() const { return impl_->parameters; }
int64_t Trainer::trainable_values() const {
  const dc::train::LoraCore* lora = impl_->trainer->lora();
  return lora != nullptr ? lora->params().n_values() : impl_->parameters;
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

namespace dc::api {

diffucoder::Result<std::unique_ptr<diffucoder::Trainer>> create_trainer(const diffucoder::TrainConfig& config,
                                                                        Profiler* profiler) {
  return diffucoder::Trainer::Impl::create(config, profiler);
}

}  // namespace dc::api
