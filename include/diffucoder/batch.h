// The public continuous-batching engine (part of the public API; included by diffucoder.h): requests of
// their own prompts, settings, rows and LoRA adapters are submitted from any thread, wait in a bounded queue,
// join the running batch at step boundaries and are advanced together by one forward per step on one engine
// thread, which owns the model's step buffers. What `diffucoder serve` decodes with (docs/api.md).
//
//   auto engine = diffucoder::BatchEngine::create(**model, {.max_batch_rows = 8});
//   diffucoder::BatchRequest req{.prompt = *ids, .config = c, .stop_ids = (*model)->stop_ids()};
//   diffucoder::Submission s = (*engine)->submit(req);
//   if (s.code != diffucoder::SubmitCode::kOk) { std::cerr << s.status.message() << "\n"; return 1; }
//   diffucoder::BatchResult r = s.job->wait();
//   std::cout << *(*model)->completion_text(r.generated[0]);
#pragma once

#include <diffucoder/diffucoder.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace diffucoder {

// The batch's limits. A request that alone exceeds the rows, positions or memory is refused at submit; one
// that fits waits until the batch has room for it.
struct BatchOptions {
  int max_batch_rows = 16;                 // rows decoded together (a request's n rows count n); 1 = one at a time
  int64_t max_batch_positions = 1 << 16;   // rows × longest canvas of a batch
  int max_queue = 256;                     // requests waiting; more are refused (kQueueFull)
  double max_queue_seconds = 120.0;        // a request waiting longer fails with BatchResult::queue_timeout
  int64_t max_memory_bytes = 0;            // the batch's step buffers at most (BatchEngine::memory_needed;
                                           // at least head_block_bytes()); on a device (LoadOptions::device) its
                                           // memory: the jobs' KV caches, activations and logits rows; 0 = no limit
};

// Called on the engine thread (and by submit for the queue depth): the batch's numbers, e.g. for metrics.
// Implementations must be thread-safe and must not block.
class BatchObserver {
 public:
  virtual ~BatchObserver() = default;
  // One batched step of `rows` rows that committed `tokens` tokens, `forward_seconds` of it in forwards.
  virtual void on_step(double seconds, double forward_seconds, int64_t rows, int64_t tokens) = 0;
  // A request that ran ended (done, stopped, cancelled or failed) after waiting and running so long.
  virtual void on_job_done(double queue_seconds, double run_seconds) = 0;
  virtual void set_queue_depth(int64_t n) = 0;   // requests waiting
  virtual void set_active_rows(int64_t n) = 0;   // rows in the batch
};

struct BatchRequest {
  std::vector<int32_t> prompt;             // token ids, unpadded
  GenerationConfig config;                 // num_return_sequences = the request's rows; output_history unused
  // When every row's final prefix (unmasked from the left) holds one of these, the request ends early
  // (BatchResult::stopped_early) with the text it would have had; empty: never early.
  std::vector<int32_t> stop_ids;
  std::string adapter;                     // a LoRA adapter of the model by name (Model::adapter_names); "" = none
  bool publish_steps = false;              // a BatchStep after every step (streaming)
};

// The generated region of every row after a step: [n_rows][max new tokens], the mask id where masked.
struct BatchStep {
  int step = 0;                            // steps run so far
  int n_steps = 0;
  std::vector<std::vector<int32_t>> rows;
};

struct BatchResult {
  Status status;                           // ok, or why the request failed (kCancelled after cancel())
  bool queue_timeout = false;              // waited longer than max_queue_seconds (a server's 503)
  bool unavailable = false;                // memory ran out on the engine thread, or the engine stopped (503)
  bool model_error = false;                // the forward or the sampler failed, e.g. NaN logits (500)
  bool stopped_early = false;              // every row reached a stop id
  std::vector<std::vector<int32_t>> generated;  // [n_rows][max new tokens] (masks left when stopped early)
  int steps_run = 0, forwards = 0;
  double forward_ms = 0.0, sampling_ms = 0.0;
  double queue_ms = 0.0, run_ms = 0.0;     // waiting in the queue, then in the batch
};

// One submitted request. Thread-safe; shared by whoever waits on it and the engine thread.
class BatchJob {
 public:
  ~BatchJob();
  BatchJob(const BatchJob&) = delete;
  BatchJob& operator=(const BatchJob&) = delete;

  int64_t n_rows() const;
  // Any thread: the request leaves the queue or the batch at the next step boundary (kCancelled).
  void cancel();
  bool cancelled() const;
  // Blocks until the request left the queue (admitted or finished) or `timeout` passed; true when it did.
  bool wait_admitted(std::chrono::milliseconds timeout);
  // Blocks until news or `timeout`: moves the steps published since the last call into *steps (may be
  // nullptr) and returns true once the request has finished, with the result in *result (may be nullptr).
  bool wait(std::chrono::milliseconds timeout, std::vector<BatchStep>* steps, BatchResult* result);
  // Blocks until the request finished; its result.
  BatchResult wait();
  // `fn` is called after every published step and when the request finishes, on the engine thread (or
  // stop()'s), and at once when news is waiting. It must not block: the engine thread waits for it.
  void set_listener(std::function<void()> fn);

 private:
  friend class BatchEngine;
  struct Impl;
  explicit BatchJob(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Why submit() refused a request (the job is null unless kOk).
enum class SubmitCode {
  kOk = 0,
  kInvalid,     // the request is malformed (status names the field): a config value, an id, an adapter name
  kQueueFull,   // max_queue requests are waiting
  kTooLarge,    // its rows or canvas alone exceed max_batch_rows / max_batch_positions
  kOverMemory,  // its step buffers alone exceed max_memory_bytes (memory_needed says how much)
  kStopped,     // the engine is stopping
};

struct Submission {
  SubmitCode code = SubmitCode::kOk;
  Status status;                           // the reason, naming the field or the limit; ok with kOk
  std::shared_ptr<BatchJob> job;
};

class BatchEngine {
 public:
  // Starts the engine thread over `model`, which must outlive the engine. invalid_argument naming the
  // field for a limit below 1 or a max_memory_bytes below head_block_bytes(). `observer` (may be null;
  // not owned, outlives the engine) sees the batch's numbers.
  static Result<std::unique_ptr<BatchEngine>> create(const Model& model, const BatchOptions& options,
                                                     BatchObserver* observer = nullptr);
  ~BatchEngine();  // stop()
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Checks the request (the config as Model::generate does, the prompt's ids, the adapter's name) and
  // queues it. Thread-safe. Deterministic: a request's tokens are those it gets alone, whatever joins its batch.
  Submission submit(const BatchRequest& request);
  // The bytes weighed against max_memory_bytes for `request` alone: its step buffers (rows × masked window
  // × the head's bytes per row, and its canvas), the batch's head block, and a head of its own with a KV
  // cache. invalid_argument as submit.
  Result<int64_t> memory_needed(const BatchRequest& request) const;
  // The fixed block of logits one batched forward's head holds (this model's vocabulary × its chunk of rows).
  int64_t head_block_bytes() const;
  // Finishes every queued and running request (unavailable, "shutting down") and ends the engine thread;
  // later submits get kStopped. Idempotent.
  void stop();
  const BatchOptions& options() const;

 private:
  struct Impl;
  explicit BatchEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace diffucoder
