// generate(): the whole generation as a loop over one Decoder (sampler/decoder.h), which holds the step
// semantics (Dream's `_sample`, the hooks, block decoding, KV-cache forwards, threshold / factor), and the
// full-path HeadSampler over a LogitsFn.
#include "sampler/generate.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <new>

#include "core/clock.h"
#include "sampler/decoder.h"
#include "sampler/filters.h"

namespace dc {
namespace {

using Clock = std::chrono::steady_clock;

// The full path: a forward's [n_out, n_vocab] logits in one buffer, sampled in place.
class DenseLogitsHead final : public HeadSampler {
 public:
  DenseLogitsHead(LogitsFn logits_fn, int64_t n_vocab, ThreadPool* pool)
      : logits_fn_(std::move(logits_fn)), n_vocab_(n_vocab), pool_(pool) {}

  Status forward(const ForwardBatch& batch) {
    n_rows_ = batch.n_out;
    logits_.resize(static_cast<size_t>(n_rows_ * n_vocab_));
    return logits_fn_(batch, logits_.data());
  }
  int64_t n_rows() const override { return n_rows_; }
  Status logits(int64_t first, int64_t n, float* out) override {
    std::memcpy(out, logits_.data() + first * n_vocab_, static_cast<size_t>(n * n_vocab_) * sizeof(float));
    return Status::ok_status();
  }
  Status sample(const HeadSampling& args, std::span<TokenSample> out) override {
    return sample_head_rows(args, 0, static_cast<int64_t>(args.rows.size()), logits_.data(), 0, n_vocab_, pool_, out);
  }
  void release() override {
    std::vector<float>().swap(logits_);
    n_rows_ = 0;
  }

 private:
  LogitsFn logits_fn_;
  int64_t n_vocab_;
  ThreadPool* pool_;
  int64_t n_rows_ = 0;
  std::vector<float> logits_;  // [n_rows_, n_vocab_]
};

Result<GenerateOutput> generate_or_throw(const HeadFn& head_fn, int64_t n_vocab,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const SamplingParams& params, const GenerateHooks& hooks) {
  const Clock::time_point t_start = Clock::now();
  DC_ASSIGN_OR_RETURN(Decoder decoder, Decoder::start(n_vocab, prompts, params, hooks));
  for (decoder.prepare(); !decoder.done(); decoder.prepare()) {
    if (decoder.needs_forward()) {
      const ForwardBatch batch = decoder.forward_batch();
      const Clock::time_point t_fwd = Clock::now();
      Result<HeadSampler*> head = head_fn(batch);
      const double forward_ms = ms_since(t_fwd);
      decoder.record_forward(forward_ms, batch.n_computed());
      if (!head.ok())
        return head.status().with_context("the model's forward at step " + std::to_string(decoder.steps_done()));
      if (hooks.on_forward) hooks.on_forward(batch, forward_ms);
      decoder.set_head(*head, 0);
    }
    DC_RETURN_IF_ERROR(decoder.step());
  }
  GenerateOutput out = decoder.finish();
  out.timings.total_ms = ms_since(t_start);
  return out;
}

}  // namespace

HeadFn head_fn_from_logits(LogitsFn logits_fn, int64_t n_vocab, ThreadPool* pool) {
  auto head = std::make_shared<DenseLogitsHead>(std::move(logits_fn), n_vocab, pool);
  return [head](const ForwardBatch& batch) -> Result<HeadSampler*> {
    DC_RETURN_IF_ERROR(head->forward(batch));
    return static_cast<HeadSampler*>(head.get());
  };
}

Result<GenerateOutput> generate(const HeadFn& head_fn, int64_t n_vocab,
                                const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                const GenerateHooks& hooks) {
  if (!head_fn) return invalid_argument("head_fn: empty function");
  try {
    return generate_or_throw(head_fn, n_vocab, prompts, params, hooks);
  } catch (const std::bad_alloc&) {  // the canvas, the logits or the sampling buffers
    return resource_exhausted("generate: out of memory for the canvas, logits or sampling buffers of " +
                              std::to_string(prompts.size()) + " prompts; use fewer prompts or new tokens");
  }
}

Result<GenerateOutput> generate(const LogitsFn& logits_fn, int64_t n_vocab,
                                const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                const GenerateHooks& hooks) {
  if (!logits_fn) return invalid_argument("logits_fn: empty function");
  return generate(head_fn_from_logits(logits_fn, n_vocab, hooks.pool), n_vocab, prompts, params, hooks);
}

}  // namespace dc
