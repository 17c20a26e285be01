// BatchEngine: the public continuous-batching engine, the Scheduler (api/scheduler.h) over a Model's Engine.
// Requests are checked here (the config, the prompt's ids and canvas, the KV cache, the adapter's name) so that
// submit's errors name the field; the Scheduler's Jobs carry them, and their snapshots and results are copied
// into the public types.
#include <diffucoder/batch.h>

#include <utility>

#include "api/config.h"
#include "api/model_impl.h"
#include "api/scheduler.h"
#include "api/status_convert.h"
#include "sampler/decoder.h"

namespace diffucoder {

using dc::api::to_public;

struct BatchJob::Impl {
  std::shared_ptr<dc::api::Job> job;
};

struct BatchEngine::Impl {
  dc::Engine& engine;
  BatchOptions options;
  std::unique_ptr<dc::api::Scheduler> scheduler;

  // The scheduler's Job of `r`, or why `r` is malformed (invalid_argument / out_of_range naming the field).
  dc::Result<std::shared_ptr<dc::api::Job>> make_job(const BatchRequest& r) const;
};

namespace {

BatchResult to_public_result(dc::api::JobResult&& r) {
  BatchResult out;
  out.status = to_public(r.status);
  out.queue_timeout = r.queue_timeout;
  out.unavailable = r.unavailable;
  out.model_error = r.model_error;
  out.stopped_early = r.stopped_early;
  out.generated = std::move(r.generated);
  out.steps_run = r.timings.steps_run;
  out.forwards = r.timings.forwards;
  out.forward_ms = r.timings.forward_ms;
  out.sampling_ms = r.timings.sampling_ms;
  out.queue_ms = r.queue_ms;
  out.run_ms = r.run_ms;
  return out;
}

}  // namespace

BatchJob::BatchJob(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchJob::~BatchJob() = default;

int64_t BatchJob::n_rows() const { return impl_->job->n_rows(); }
void BatchJob::cancel() { impl_->job->cancel(); }
bool BatchJob::cancelled() const { return impl_->job->cancelled(); }
bool BatchJob::wait_admitted(std::chrono::milliseconds timeout) { return impl_->job->wait_admitted(timeout); }
void BatchJob::set_listener(std::function<void()> fn) { impl_->job->set_listener(std::move(fn)); }

bool BatchJob::wait(std::chrono::milliseconds timeout, std::vector<BatchStep>* steps, BatchResult* result) {
  std::vector<dc::api::JobSnapshot> snapshots;
  dc::api::JobResult r;
  const bool finished = impl_->job->wait(timeout, steps != nullptr ? &snapshots : nullptr, &r);
  if (steps != nullptr)
    for (dc::api::JobSnapshot& s : snapshots) steps->push_back(BatchStep{s.step, s.n_steps, std::move(s.rows)});
  if (finished && result != nullptr) *result = to_public_result(std::move(r));
  return finished;
}

BatchResult BatchJob::wait() {
  BatchResult result;
  while (!wait(std::chrono::milliseconds(1000), nullptr, &result)) {
  }
  return result;
}

dc::Result<std::shared_ptr<dc::api::Job>> BatchEngine::Impl::make_job(const BatchRequest& r) const {
  const dc::ModelConfig& c = engine.config();
  DC_ASSIGN_OR_RETURN(dc::SamplingParams p, dc::api::sampling_params(engine.default_params(), r.config));
  p.output_history = false;  // a job publishes its steps instead (publish_steps)
  DC_RETURN_IF_ERROR(dc::validate(p, c.n_vocab));
  DC_RETURN_IF_ERROR(dc::check_cache_on_device(p, engine.backend()));
  if (r.prompt.empty()) return dc::invalid_argument("prompt: empty (no tokens)");
  DC_RETURN_IF_ERROR(dc::check_prompt_ids(r.prompt, c.n_vocab, "prompt"));
  DC_RETURN_IF_ERROR(dc::check_prompt_ids(r.stop_ids, c.n_vocab, "stop_ids"));
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  const dc::Result<int64_t> length = dc::canvas_length_in_context(p, n, c.max_position_embeddings);
  if (!length.ok()) return length.status().with_context("max_new_tokens");
  DC_RETURN_IF_ERROR(dc::check_generation_size({r.prompt}, p, c.n_vocab));
  if (p.cache != dc::CacheMode::kNone && engine.kv_cache_bytes(p.num_return_sequences, *length) > engine.max_kv_cache_bytes())
    return dc::invalid_argument("cache: num_return_sequences × (prompt + max_new_tokens) needs a KV cache of " +
                                std::to_string(engine.kv_cache_bytes(p.num_return_sequences, *length) >> 20) +
                                " MiB, more than the model's limit of " + std::to_string(engine.max_kv_cache_bytes() >> 20) +
                                " MiB (LoadOptions::max_kv_cache_bytes); use cache none");
  const dc::LoraWeights* lora = nullptr;
  if (!r.adapter.empty()) {
    lora = engine.lora_adapter(r.adapter);
    if (lora == nullptr) {
      std::string names;
      for (const std::string& name : engine.lora_adapter_names()) names += (names.empty() ? "'" : ", '") + name + "'";
      return dc::not_found("adapter: '" + r.adapter + "' is not an adapter of this model (" +
                           (names.empty() ? std::string("it has none") : "it has " + names) + ")");
    }
  }
  return std::make_shared<dc::api::Job>(r.prompt, std::move(p), r.stop_ids, r.publish_steps, lora);
}

BatchEngine::BatchEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchEngine::~BatchEngine() { stop(); }

Result<std::unique_ptr<BatchEngine>> BatchEngine::create(const Model& model, const BatchOptions& options,
                                                         BatchObserver* observer) {
  dc::Engine& engine = *model.impl_->engine;
  const auto refuse = [](const std::string& what) { return Status(StatusCode::kInvalidArgument, what); };
  if (options.max_batch_rows < 1) return refuse("max_batch_rows: must be >= 1 (got " + std::to_string(options.max_batch_rows) + ")");
  if (options.max_batch_positions < 1)
    return refuse("max_batch_positions: must be >= 1 (got " + std::to_string(options.max_batch_positions) + ")");
  if (options.max_queue < 0) return refuse("max_queue: must be >= 0 (got " + std::to_string(options.max_queue) + ")");
  if (!(options.max_queue_seconds >= 0))
    return refuse("max_queue_seconds: must be >= 0 (got " + std::to_string(options.max_queue_seconds) + ")");
  const dc::HeadMemory head = engine.head_memory();
  if (options.max_memory_bytes < 0 || (options.max_memory_bytes > 0 && options.max_memory_bytes < head.fixed_bytes))
    return refuse("max_memory_bytes: " + std::to_string(options.max_memory_bytes) + " is below the " +
                  std::to_string(head.fixed_bytes >> 20) + " MiB block of logits one step needs for this model's "
                  "vocabulary (head_block_bytes(); 0 = no limit)");
  auto impl = std::unique_ptr<Impl>(new Impl{engine, options, nullptr});
  impl->scheduler = std::make_unique<dc::api::Scheduler>(engine.head_fn(), engine.config().n_vocab, head, &engine.pool(),
                                                         options, observer, [&engine] { return engine.head_fn(); },
                                                         // The cached requests' steps in one forward (either device)
                                                         [&engine] { return engine.parts_head_fn(); });
  return std::unique_ptr<BatchEngine>(new BatchEngine(std::move(impl)));
}

Submission BatchEngine::submit(const BatchRequest& request) {
  dc::Result<std::shared_ptr<dc::api::Job>> job = impl_->make_job(request);
  if (!job.ok()) return Submission{SubmitCode::kInvalid, to_public(job.status()), nullptr};
  const BatchOptions& o = impl_->options;
  const auto refused = [](SubmitCode code, StatusCode status, std::string message) {
    return Submission{code, Status(status, std::move(message)), nullptr};
  };
  switch (impl_->scheduler->submit(*job)) {
    case dc::api::SubmitResult::kOk: break;
    case dc::api::SubmitResult::kQueueFull:
      return refused(SubmitCode::kQueueFull, StatusCode::kResourceExhausted,
                     "the queue is full (max_queue " + std::to_string(o.max_queue) + " requests waiting); retry later");
    case dc::api::SubmitResult::kTooLarge:
      return refused(SubmitCode::kTooLarge, StatusCode::kOutOfRange,
                     "num_return_sequences × (prompt + max_new_tokens) exceeds the batch limits (max_batch_rows " +
                         std::to_string(o.max_batch_rows) + ", max_batch_positions " +
                         std::to_string(o.max_batch_positions) + ")");
    case dc::api::SubmitResult::kOverMemory:
      return refused(SubmitCode::kOverMemory, StatusCode::kResourceExhausted,
                     "the request needs about " + std::to_string(impl_->scheduler->memory_needed(**job) >> 20) +
                         " MiB of step buffers, more than max_memory_bytes (" + std::to_string(o.max_memory_bytes >> 20) +
                         " MiB); ask for fewer tokens or rows, or decode in blocks (block_length)");
    case dc::api::SubmitResult::kStopped:
      return refused(SubmitCode::kStopped, StatusCode::kFailedPrecondition, "the batch engine is stopping");
  }
  auto impl = std::make_unique<BatchJob::Impl>();
  impl->job = std::move(*job);
  return Submission{SubmitCode::kOk, Status(), std::shared_ptr<BatchJob>(new BatchJob(std::move(impl)))};
}

Result<int64_t> BatchEngine::memory_needed(const BatchRequest& request) const {
  dc::Result<std::shared_ptr<dc::api::Job>> job = impl_->make_job(request);
  if (!job.ok()) return to_public(job.status());
  return impl_->scheduler->memory_needed(**job);
}

int64_t BatchEngine::head_block_bytes() const { return impl_->engine.head_memory().fixed_bytes; }
void BatchEngine::stop() { impl_->scheduler->stop(); }
const BatchOptions& BatchEngine::options() const { return impl_->options; }

}  // namespace diffucoder
