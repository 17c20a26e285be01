// The engine thread and continuous batching, behind the public diffucoder::BatchEngine (batch.cc): jobs (one
// prompt × n rows, own SamplingParams) wait in a bounded queue, join the running batch at step boundaries, are
// advanced together by ONE forward per step over all their rows (left-padded to the longest canvas; one
// forward per LoRA adapter when jobs pick adapters; the jobs with a KV cache in one forward of parts per
// adapter, each over its own cache, where the engine makes one: the CPU's or a device's) whose rows are then
// sampled in ONE call (HeadSampler::sample_parts: one lm_head pass, one submission on a device; each job with
// its own settings), and leave when done, cancelled or stopped.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <diffucoder/batch.h>

#include "core/status.h"
#include "sampler/generate.h"

namespace dc {
class ThreadPool;
struct LoraWeights;  // model/lora_weights.h
}

namespace dc::api {

// The generated region of every row of a job after a step: [n_rows][max_new_tokens], mask id where masked.
struct JobSnapshot {
  int step = 0;     // steps run so far
  int n_steps = 0;
  std::vector<std::vector<int32_t>> rows;
};

struct JobResult {
  Status status;                                 // ok, or why the job failed
  bool queue_timeout = false;                    // waited longer than max_queue_seconds (→ 503)
  bool unavailable = false;                      // memory ran out on the engine thread, or the server stopped (→ 503)
  bool model_error = false;                      // the forward or the sampler failed, e.g. NaN logits (→ 500)
  bool stopped_early = false;                    // every row had a stop id in its final prefix
  std::vector<std::vector<int32_t>> generated;   // [n_rows][max_new_tokens] (masks left when stopped early)
  GenerateTimings timings;
  double queue_ms = 0.0, run_ms = 0.0;
};

// One request's generation, shared by the HTTP handler (submit, wait, cancel) and the engine thread.
class Job {
 public:
  // `stop_ids`: when every row's final prefix (unmasked from the left) holds one, the job ends early with
  // the same post-processed text. `publish_steps`: a snapshot after every step (for streaming).
  // `lora`: the unmerged adapter every forward of this job adds (ForwardBatch::lora; not owned, outlives the
  // job; null: the model as it is), e.g. Engine::lora_adapter(the request's model name).
  Job(std::vector<int32_t> prompt, SamplingParams params, std::vector<int32_t> stop_ids, bool publish_steps,
      const LoraWeights* lora = nullptr)
      : prompt_(std::move(prompt)), params_(std::move(params)), stop_ids_(std::move(stop_ids)),
        publish_steps_(publish_steps), lora_(lora) {}

  const std::vector<int32_t>& prompt() const { return prompt_; }
  const LoraWeights* lora() const { return lora_; }
  const SamplingParams& params() const { return params_; }
  int64_t n_rows() const { return params_.num_return_sequences; }

  // Any thread: the engine drops the job at the next step boundary (its row leaves the batch).
  void cancel();
  bool cancelled() const;

  // Blocks until the job left the queue (admitted or finished) or `timeout` passed; true when it did.
  bool wait_admitted(std::chrono::milliseconds timeout);
  // Blocks until news or `timeout`: moves the snapshots published since the last call into *steps (may be
  // nullptr) and returns true once the job has finished, with the result in *result.
  bool wait(std::chrono::milliseconds timeout, std::vector<JobSnapshot>* steps, JobResult* result);
  // `fn` is called after every published snapshot and when the job finishes (on the thread that publishes or
  // finishes: the engine thread, or stop()'s; outside the job's lock), and at once when news is waiting. It
  // must not block: the engine thread waits for it.
  void set_listener(std::function<void()> fn);

 private:
  friend class Scheduler;
  void set_admitted();
  void publish(JobSnapshot snapshot);
  void finish(JobResult result);
  void notify();  // calls the listener, if any (not under mu_)

  const std::vector<int32_t> prompt_;
  const SamplingParams params_;
  const std::vector<int32_t> stop_ids_;
  const bool publish_steps_;
  const LoraWeights* const lora_;
  std::chrono::steady_clock::time_point submitted_, admitted_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false, admitted_flag_ = false, finished_ = false;
  std::deque<JobSnapshot> snapshots_;
  JobResult result_;
  std::function<void()> listener_;
};

// The public limits as given (max_memory_bytes: job_memory_bytes of the batch's jobs plus the heads' fixed blocks).
using SchedulerOptions = diffucoder::BatchOptions;

enum class SubmitResult { kOk, kQueueFull, kTooLarge, kOverMemory, kStopped };

// The step buffers a job needs at most: what its widest step holds per out row (rows × masked window ×
// head.bytes_per_row: the hidden row and the sampler's numbers; the head turns them into logits a chunk of
// rows at a time) and its canvas; on a device also rows × canvas × (head.bytes_per_position, the forward's
// activations, + head.kv_bytes_per_position for a job with a KV cache). A batch needs the sum over its jobs
// plus each head's fixed block (on a device an upper bound: the forwards' activations are shared buffers,
// as large as the largest forward's).
int64_t job_memory_bytes(const SamplingParams& params, int64_t prompt_tokens, const HeadMemory& head);

class Scheduler {
 public:
  // `head_fn` (the batched forward; its HeadMemory `head`) is called only from the engine thread; `metrics`
  // (may be null) sees each step, finished job and queue change; `pool` (may be null) samples a
  // logits_hook's rows (the head samples with its own). `make_cached_fn` (may be empty: such jobs then fail
  // as unimplemented) makes a model function with a KV cache of its own for each job whose params use one
  // (CacheMode prefix / dual; each holds head.fixed_bytes more); those jobs run their own forward over their
  // window each step instead of joining the batched one. Jobs with an adapter (Job::lora) join the batched
  // forward of the jobs with the same adapter only: each adapter's group runs its own forward, through a head
  // function of its own made by `make_cached_fn` (its block counted once in the memory budget while the group
  // has jobs; without make_cached_fn such jobs fail as unimplemented).
  //
  // `make_parts_fn` (may be empty; e.g. Engine::parts_head_fn, on either device) makes a PartsHeadFn: with it the
  // scheduler owns each cached job's KvCache and runs the step of all cached jobs of one adapter as ONE
  // forward of parts (each job's window over its own cache, its own step state), through a parts function
  // of that adapter's own (made on first use), instead of one forward per job (make_cached_fn is then used
  // for the uncached adapters' groups only).
  Scheduler(HeadFn head_fn, int64_t n_vocab, HeadMemory head, ThreadPool* pool, SchedulerOptions options,
            diffucoder::BatchObserver* metrics, std::function<HeadFn()> make_cached_fn = nullptr,
            std::function<PartsHeadFn()> make_parts_fn = nullptr);
  ~Scheduler();  // stops the engine thread; unfinished jobs finish with an error
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job. kTooLarge: its rows or canvas alone exceed the batch limits; kOverMemory: its step buffers
  // alone exceed max_memory_bytes; kQueueFull: max_queue waiting. A job that fits waits until the batch
  // has room for it (rows, positions and memory).
  SubmitResult submit(const std::shared_ptr<Job>& job);
  // What submit() weighs against max_memory_bytes for `job` alone: its step buffers, the batch's head
  // block, and a head of its own when cached.
  int64_t memory_needed(const Job& job) const;
  void stop();

  const SchedulerOptions& options() const { return options_; }

 private:
  struct Active;
  void run();
  bool admit(std::vector<Active>& active);
  // One step of the batch: retire_and_prepare, forward, step_decoders, publish_and_retire.
  void step_batch(std::vector<Active>& active);
  void retire(std::vector<Active>& active, size_t i, JobResult result);
  void retire_and_prepare(std::vector<Active>& active);  // cancelled and finished jobs leave; prepare()
  using Failures = std::vector<std::pair<size_t, Status>>;  // active index → why its forward failed
  void forward(std::vector<Active>& active, double* forward_s);
  // `call` runs a forward and returns its head, which is kept in *keep (may be null) for release when idle.
  bool run_head(std::vector<Active>& active, const std::function<Result<HeadSampler*>()>& call, HeadSampler** keep,
                const std::vector<size_t>& jobs, const std::vector<int64_t>& first_rows,
                const std::vector<int64_t>& computed, double* forward_s, Failures* failed);
  void step_decoders(std::vector<Active>& active, std::vector<Status>& statuses, std::vector<int64_t>& unmasked);
  void step_merged(std::vector<Active>& active, std::vector<Status>& statuses, std::vector<uint8_t>& stepped);
  void publish_and_retire(std::vector<Active>& active, const std::vector<Status>& statuses,
                          const std::vector<int64_t>& unmasked, std::chrono::steady_clock::time_point t0,
                          double forward_s);

  // The memory the budget counts for `job` (its step buffers, plus a head of its own when cached).
  int64_t memory_of(const Job& job) const;

  // One batched forward's jobs: `active` indices with the same adapter.
  void forward_group(std::vector<Active>& active, const std::vector<size_t>& jobs, double* forward_s, Failures* failed);
  // The head function of the batched forward of adapter `lora` (head_fn_ for null), made on first use.
  const HeadFn* group_fn(const LoraWeights* lora);
  // One forward of parts over the cached jobs `jobs` (all with the same adapter), each over its own cache.
  void forward_cached_group(std::vector<Active>& active, const std::vector<size_t>& jobs, double* forward_s,
                            Failures* failed);

  HeadFn head_fn_;
  HeadSampler* batched_head_ = nullptr;  // what head_fn_ last returned: released when the engine is idle
  struct AdapterHead {                   // the batched forward of the jobs of one adapter
    const LoraWeights* lora = nullptr;
    HeadFn fn;
    HeadSampler* head = nullptr;         // what fn last returned: released when the engine is idle
  };
  std::deque<AdapterHead> adapter_heads_;  // stable addresses: run_head keeps their heads
  std::function<HeadFn()> make_cached_fn_;
  struct CachedHead {                      // the forward of parts of the cached jobs of one adapter
    const LoraWeights* lora = nullptr;
    PartsHeadFn fn;
    HeadSampler* head = nullptr;           // what fn last returned: released when the engine is idle
  };
  std::deque<CachedHead> cached_heads_;
  std::function<PartsHeadFn()> make_parts_fn_;
  std::vector<TokenSample> merged_samples_;  // a merged step's samples, every decoder's (step_merged), reused
  const int64_t n_vocab_;
  const HeadMemory head_;
  ThreadPool* pool_;
  const SchedulerOptions options_;
  diffucoder::BatchObserver* metrics_;  // may be null

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dc::api
