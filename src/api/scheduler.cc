// Scheduler: the engine thread. Each step admits queued jobs that fit, prepares every active Decoder, runs ONE
// forward over the rows of all decoders that need logits (left-padded to the longest canvas), samples the rows
// of the decoders that share a forward in one call, steps every decoder, publishes snapshots and retires
// finished, stopped or cancelled jobs.
#include "api/scheduler.h"

#include <malloc.h>

#include <algorithm>
#include <new>
#include <optional>

#include "core/thread_pool.h"
#include "model/kv_cache.h"
#include "sampler/batch_merge.h"
#include "sampler/decoder.h"

namespace dc::api {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The job's canvas length (the sampler's rule); 0 when its parameters give none (Decoder::start then
// fails the job with the reason).
int64_t canvas_of(const Job& job) {
  const Result<int64_t> length = canvas_length(job.params(), static_cast<int64_t>(job.prompt().size()));
  return length.ok() ? *length : 0;
}

// The generated part of every row of the decoder's canvas (after the padded prompt).
std::vector<std::vector<int32_t>> generated_rows(const Decoder& d) {
  std::vector<std::vector<int32_t>> rows;
  const std::span<const int32_t> canvas = d.canvas();
  for (int64_t b = 0; b < d.n_rows(); ++b) {
    const auto row = canvas.begin() + b * d.n_seq();
    rows.emplace_back(row + d.prompt_width(), row + d.n_seq());
  }
  return rows;
}

// Early stop: every row's final prefix (unmasked from the left) contains a stop id.
bool all_rows_stopped(const Decoder& d, const std::vector<int32_t>& stop_ids, int32_t mask) {
  bool all_stopped = !stop_ids.empty();
  for (int64_t b = 0; all_stopped && b < d.n_rows(); ++b) {
    bool stopped = false;
    for (int64_t j = d.prompt_width(); j < d.n_seq(); ++j) {
      const int32_t t = d.canvas()[static_cast<size_t>(b * d.n_seq() + j)];
      if (t == mask) break;
      if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) {
        stopped = true;
        break;
      }
    }
    all_stopped = stopped;
  }
  return all_stopped;
}

// Decoder::start, with running out of memory for the canvas reported as a Status.
Result<Decoder> start_decoder(int64_t n_vocab, const std::vector<int32_t>& prompt, const SamplingParams& params,
                              const GenerateHooks& hooks) {
  try {
    return Decoder::start(n_vocab, {prompt}, params, hooks);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("server: out of memory for the canvas of a job of " + std::to_string(prompt.size()) +
                              " prompt tokens");
  }
}

// The result of a job whose forward or sampling failed: memory that ran out (the host's, or a device's: its KV
// cache, its activations, its logits) is the server's (503); anything else the model's (500: e.g. non-finite
// logits the sampler refused).
JobResult step_failure(Status status) {
  JobResult r;
  r.unavailable = status.code() == StatusCode::kResourceExhausted;
  r.model_error = !r.unavailable;
  r.status = std::move(status);
  return r;
}

}  // namespace

int64_t job_memory_bytes(const SamplingParams& params, int64_t prompt_tokens, const HeadMemory& head) {
  const Result<int64_t> n_seq = canvas_length(params, prompt_tokens);
  if (!n_seq.ok()) return 0;  // Decoder::start fails such a job with the reason
  const int64_t rows = params.num_return_sequences, new_tokens = *n_seq - prompt_tokens;
  const int64_t window = params.block_length > 0 ? std::min(params.block_length, new_tokens) : new_tokens;
  constexpr int64_t kCanvasBytesPerPosition = 16;  // tokens, validity, positions, history of one position
  // On a device: the activations of a forward over the whole canvas (the first, or a refresh) and the KV cache.
  const int64_t per_position = kCanvasBytesPerPosition + head.bytes_per_position +
                               (params.cache != CacheMode::kNone ? head.kv_bytes_per_position : 0);
  return rows * window * head.bytes_per_row + rows * *n_seq * per_position;
}

// ---------------------------------------------------------------------------------------------------
// Job

void Job::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool Job::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool Job::wait_admitted(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return admitted_flag_ || finished_; });
}

bool Job::wait(std::chrono::milliseconds timeout, std::vector<JobSnapshot>* steps, JobResult* result) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !snapshots_.empty(); });
  if (steps != nullptr) {
    for (JobSnapshot& s : snapshots_) steps->push_back(std::move(s));
  }
  snapshots_.clear();
  if (finished_ && result != nullptr) *result = result_;
  return finished_;
}

void Job::set_admitted() {
  std::lock_guard<std::mutex> lock(mu_);
  admitted_flag_ = true;
  cv_.notify_all();
}

void Job::set_listener(std::function<void()> fn) {
  bool news;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = std::move(fn);
    news = finished_ || !snapshots_.empty();
  }
  if (news) notify();
}

void Job::notify() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn = listener_;
  }
  if (fn) fn();
}

void Job::publish(JobSnapshot snapshot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshots_.push_back(std::move(snapshot));
    cv_.notify_all();
  }
  notify();
}

void Job::finish(JobResult result) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(result);
    finished_ = true;
    cv_.notify_all();
  }
  notify();
}

// ---------------------------------------------------------------------------------------------------
// Scheduler

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  Decoder decoder;
  Clock::time_point started;
  HeadFn cached_fn;  // jobs with a KV cache without make_parts_fn: their own model function (own cache)
  std::unique_ptr<KvCache> cache;  // jobs with a KV cache with make_parts_fn: their cache in the forward of parts
  HeadSampler* head = nullptr;     // the head of this step's forward (run_head), null without one
};

Scheduler::Scheduler(HeadFn head_fn, int64_t n_vocab, HeadMemory head, ThreadPool* pool, SchedulerOptions options,
                     diffucoder::BatchObserver* metrics, std::function<HeadFn()> make_cached_fn,
                     std::function<PartsHeadFn()> make_parts_fn)
    : head_fn_(std::move(head_fn)),
      make_cached_fn_(std::move(make_cached_fn)),
      make_parts_fn_(std::move(make_parts_fn)),
      n_vocab_(n_vocab),
      head_(head),
      pool_(pool),
      options_(options),
      metrics_(metrics) {
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

int64_t Scheduler::memory_needed(const Job& job) const { return head_.fixed_bytes + memory_of(job); }

int64_t Scheduler::memory_of(const Job& job) const {
  const int64_t own_head = job.params().cache != CacheMode::kNone ? head_.fixed_bytes : 0;
  return job_memory_bytes(job.params(), static_cast<int64_t>(job.prompt().size()), head_) + own_head;
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SubmitResult Scheduler::submit(const std::shared_ptr<Job>& job) {
  if (job->n_rows() > options_.max_batch_rows || job->n_rows() * canvas_of(*job) > options_.max_batch_positions)
    return SubmitResult::kTooLarge;
  if (options_.max_memory_bytes > 0 && memory_needed(*job) > options_.max_memory_bytes)
    return SubmitResult::kOverMemory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return SubmitResult::kStopped;
    if (static_cast<int>(queue_.size()) >= options_.max_queue) return SubmitResult::kQueueFull;
    job->submitted_ = Clock::now();
    queue_.push_back(job);
    if (metrics_ != nullptr) metrics_->set_queue_depth(static_cast<int64_t>(queue_.size()));
  }
  cv_.notify_all();
  return SubmitResult::kOk;
}

// Moves queued jobs into the batch while they fit (FIFO), failing those that waited too long or were
// cancelled. Returns false when stopping. Called with mu_ not held.
bool Scheduler::admit(std::vector<Active>& active) {
  std::unique_lock<std::mutex> lock(mu_);
  if (active.empty()) {
    if (metrics_ != nullptr) metrics_->set_active_rows(0);
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  }
  if (stopping_) return false;
  const Clock::time_point now = Clock::now();
  for (auto it = queue_.begin(); it != queue_.end();) {  // expire and drop cancelled jobs anywhere in the queue
    Job& job = **it;
    const double waited_ms = ms_between(job.submitted_, now);
    if (job.cancelled() || waited_ms > options_.max_queue_seconds * 1000.0) {
      JobResult r;
      r.queue_timeout = !job.cancelled();
      r.status = job.cancelled() ? cancelled("job cancelled while queued")
                                 : out_of_range("queue: waited longer than the server's queue time limit");
      r.queue_ms = waited_ms;
      job.finish(std::move(r));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  int64_t rows = 0, width = 0, memory = head_.fixed_bytes;  // the batched head's block
  std::vector<const LoraWeights*> adapters;  // the batched forwards' adapters: a head block each
  const auto adapter_memory = [&](const Job& job) -> int64_t {
    if (job.lora() == nullptr || job.params().cache != CacheMode::kNone ||
        std::find(adapters.begin(), adapters.end(), job.lora()) != adapters.end())
      return 0;
    return head_.fixed_bytes;
  };
  const auto add_adapter = [&](const Job& job) {
    if (adapter_memory(job) > 0) adapters.push_back(job.lora());
  };
  for (const Active& a : active) {
    rows += a.decoder.n_rows();
    width = std::max(width, a.decoder.n_seq());
    memory += memory_of(*a.job) + adapter_memory(*a.job);
    add_adapter(*a.job);
  }
  while (!queue_.empty()) {
    std::shared_ptr<Job> job = queue_.front();
    const int64_t w = std::max(width, canvas_of(*job));
    const int64_t m = memory_of(*job) + adapter_memory(*job);
    if (rows + job->n_rows() > options_.max_batch_rows || (rows + job->n_rows()) * w > options_.max_batch_positions)
      break;
    if (options_.max_memory_bytes > 0 && memory + m > options_.max_memory_bytes)
      break;  // waits until running jobs leave (submit() refused the jobs that can never fit)
    queue_.pop_front();
    job->admitted_ = Clock::now();
    GenerateHooks hooks;
    hooks.pool = pool_;  // set per step in step_batch()
    const bool cached = job->params().cache != CacheMode::kNone;
    bool unavailable = false;
    Result<Decoder> decoder = unimplemented("cache: this server runs without the KV cache");
    if (!cached || make_cached_fn_ || make_parts_fn_) {
      try {
        decoder = start_decoder(n_vocab_, job->prompt(), job->params(), hooks);
      } catch (const std::bad_alloc&) {
        decoder = resource_exhausted("out of memory while starting the generation; retry later or ask for fewer tokens");
        unavailable = true;
      }
    }
    if (!decoder.ok()) {
      JobResult r;
      r.status = decoder.status();
      r.unavailable = unavailable;
      r.queue_ms = ms_between(job->submitted_, job->admitted_);
      job->finish(std::move(r));
      continue;
    }
    rows += job->n_rows();
    width = w;
    memory += m;
    add_adapter(*job);
    job->set_admitted();
    const bool own_fn = cached && !make_parts_fn_;
    active.push_back(Active{job, std::move(*decoder), Clock::now(), own_fn ? make_cached_fn_() : HeadFn(),
                            cached && make_parts_fn_ ? std::make_unique<KvCache>() : nullptr});
  }
  if (metrics_ != nullptr) {
    metrics_->set_queue_depth(static_cast<int64_t>(queue_.size()));
    metrics_->set_active_rows(rows);
  }
  return true;
}

void Scheduler::run() {
  std::vector<Active> active;
  while (admit(active)) {
    if (active.empty()) continue;
    // The engine thread must outlive any one request: memory running out fails the jobs of this batch
    // (503), not the process.
    try {
      step_batch(active);
    } catch (const std::bad_alloc&) {  // the merged batch, the logits, a decoder's buffers or the model's
      for (Active& a : active) {
        JobResult r;
        r.status = resource_exhausted("server: out of memory while stepping a batch of " +
                                      std::to_string(active.size()) + " jobs; retry later or ask for fewer tokens or rows");
        r.unavailable = true;
        a.job->finish(std::move(r));
      }
      active.clear();
    }
    if (active.empty()) {  // idle: hand the batched heads' scratch and the last batch's buffers back
      if (batched_head_ != nullptr) batched_head_->release();
      for (AdapterHead& h : adapter_heads_)
        if (h.head != nullptr) h.head->release();
      for (CachedHead& h : cached_heads_)
        if (h.head != nullptr) h.head->release();
      std::vector<TokenSample>().swap(merged_samples_);
      malloc_trim(0);
    }
  }
  for (Active& a : active) {
    JobResult r;
    r.status = internal_error("server: shutting down");
    r.unavailable = true;
    a.job->finish(std::move(r));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& job : queue_) {
    JobResult r;
    r.status = internal_error("server: shutting down");
    r.queue_timeout = true;
    job->finish(std::move(r));
  }
  queue_.clear();
}

void Scheduler::step_batch(std::vector<Active>& active) {
  const Clock::time_point t0 = Clock::now();
  retire_and_prepare(active);
  if (active.empty()) return;
  double forward_s = 0.0;
  forward(active, &forward_s);
  if (active.empty()) return;
  std::vector<Status> statuses;
  std::vector<int64_t> unmasked;
  step_decoders(active, statuses, unmasked);
  publish_and_retire(active, statuses, unmasked, t0, forward_s);
}

// Finishes active[i] with `r` (plus its timings) and removes it from the batch.
void Scheduler::retire(std::vector<Active>& active, size_t i, JobResult r) {
  Active& a = active[i];
  const Clock::time_point now = Clock::now();
  r.queue_ms = ms_between(a.job->submitted_, a.job->admitted_);
  r.run_ms = ms_between(a.started, now);
  r.timings = a.decoder.timings();
  if (metrics_ != nullptr) metrics_->on_job_done(r.queue_ms / 1000.0, r.run_ms / 1000.0);
  a.job->finish(std::move(r));
  active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
}

void Scheduler::retire_and_prepare(std::vector<Active>& active) {
  // Retire cancelled and finished jobs; prepare the rest.
  for (size_t i = active.size(); i-- > 0;) {
    Active& a = active[i];
    if (a.job->cancelled()) {
      JobResult r;
      r.status = cancelled("job cancelled: the client went away");
      retire(active, i, std::move(r));
      continue;
    }
    a.decoder.prepare();
    if (a.decoder.done()) {
      JobResult r;
      r.generated = generated_rows(a.decoder);
      retire(active, i, std::move(r));
    }
  }
}

// Runs `call` and hands its head to the decoders of `jobs` (decoder k's rows start at first_rows[k]); on
// failure those jobs are added to *failed (retired by forward()) and false is returned.
bool Scheduler::run_head(std::vector<Active>& active, const std::function<Result<HeadSampler*>()>& call,
                         HeadSampler** keep, const std::vector<size_t>& jobs, const std::vector<int64_t>& first_rows,
                         const std::vector<int64_t>& computed, double* forward_s, Failures* failed) {
  const Clock::time_point tf = Clock::now();
  Result<HeadSampler*> head = call();
  if (head.ok() && keep != nullptr) *keep = *head;
  const double s = ms_between(tf, Clock::now()) / 1000.0;
  *forward_s += s;
  for (size_t k = 0; k < jobs.size(); ++k) {
    Decoder& d = active[jobs[k]].decoder;
    if (head.ok()) d.set_head(*head, first_rows[k]), active[jobs[k]].head = *head;
    d.record_forward(s * 1000.0, computed[k]);
  }
  if (head.ok()) return true;
  for (size_t k : jobs) failed->emplace_back(k, head.status().with_context("forward"));  // every job of it fails
  return false;
}

const HeadFn* Scheduler::group_fn(const LoraWeights* lora) {
  if (lora == nullptr) return &head_fn_;
  for (AdapterHead& h : adapter_heads_)
    if (h.lora == lora) return &h.fn;
  if (!make_cached_fn_) return nullptr;
  adapter_heads_.push_back(AdapterHead{lora, make_cached_fn_(), nullptr});
  return &adapter_heads_.back().fn;
}

// One forward over the rows of `jobs` (all with the same adapter), left-padded to the widest canvas
// (merge_left_padded), its head handed to the decoders, each reading its own rows. On failure the jobs are
// added to *failed.
void Scheduler::forward_group(std::vector<Active>& active, const std::vector<size_t>& jobs, double* forward_s,
                              Failures* failed) {
  const LoraWeights* lora = active[jobs[0]].job->lora();
  const HeadFn* fn = group_fn(lora);
  std::vector<ForwardBatch> parts;
  std::vector<int64_t> computed;
  for (size_t i : jobs) {
    parts.push_back(active[i].decoder.forward_batch());
    parts.back().lora = lora;
    computed.push_back(parts.back().n_computed());
  }
  if (fn == nullptr) {
    for (size_t i : jobs) failed->emplace_back(i, unimplemented("model: this server holds no LoRA adapters to pick from"));
    return;
  }
  HeadSampler** keep = &batched_head_;
  for (AdapterHead& h : adapter_heads_)
    if (fn == &h.fn) keep = &h.head;
  if (jobs.size() == 1) {  // one job: its own batch (no padding)
    run_head(active, [&] { return (*fn)(parts[0]); }, keep, jobs, {0}, computed, forward_s, failed);
    return;
  }
  const Result<MergedBatch> merged = merge_left_padded(parts);
  if (!merged.ok()) {
    for (size_t i : jobs) failed->emplace_back(i, merged.status().with_context("forward"));
    return;
  }
  ForwardBatch batch = merged->batch();
  batch.lora = lora;
  run_head(active, [&] { return (*fn)(batch); }, keep, jobs, merged->out_begin, computed, forward_s, failed);
}

void Scheduler::forward_cached_group(std::vector<Active>& active, const std::vector<size_t>& jobs, double* forward_s,
                                     Failures* failed) {
  const LoraWeights* lora = active[jobs[0]].job->lora();
  CachedHead* head = nullptr;
  for (CachedHead& h : cached_heads_)
    if (h.lora == lora) head = &h;
  if (head == nullptr) head = &cached_heads_.emplace_back(CachedHead{lora, make_parts_fn_(), nullptr});
  std::vector<ForwardBatch> parts;
  std::vector<int64_t> first_rows, computed;
  int64_t rows = 0;
  for (size_t i : jobs) {
    ForwardBatch& b = parts.emplace_back(active[i].decoder.forward_batch());
    b.lora = lora;
    b.cache = b.cache_op != CacheOp::kNone ? active[i].cache.get() : nullptr;
    first_rows.push_back(rows);
    computed.push_back(b.n_computed());
    rows += b.n_out;
  }
  run_head(active, [&] { return head->fn(parts); }, &head->head, jobs, first_rows, computed, forward_s, failed);
}

// The forwards of a step: the jobs with a KV cache in one forward of parts per adapter (each part over its
// own cache; without make_parts_fn each such job alone, through its own function), the others in one batched
// forward per adapter (the jobs without one together). A job's rows meet only rows of its own adapter, and a
// part only its own cache, so its tokens do not depend on its batch mates. The jobs of a failed forward are
// retired (500) and the rest step on.
void Scheduler::forward(std::vector<Active>& active, double* forward_s) {
  Failures failed;
  // The batched jobs and the cached jobs, by adapter in order of first appearance.
  std::vector<std::vector<size_t>> groups, cached_groups;
  const auto add = [&](std::vector<std::vector<size_t>>& to, size_t i) {
    size_t g = 0;
    while (g < to.size() && active[to[g][0]].job->lora() != active[i].job->lora()) ++g;
    if (g == to.size()) to.emplace_back();
    to[g].push_back(i);
  };
  for (size_t i = 0; i < active.size(); ++i) {
    Active& a = active[i];
    a.head = nullptr;
    if (!a.decoder.needs_forward()) continue;
    if (a.cached_fn) {
      ForwardBatch fb = a.decoder.forward_batch();
      fb.lora = a.job->lora();
      run_head(active, [&] { return a.cached_fn(fb); }, nullptr, {i}, {0}, {fb.n_computed()}, forward_s, &failed);
      continue;
    }
    add(a.cache != nullptr ? cached_groups : groups, i);
  }
  for (const std::vector<size_t>& g : groups) forward_group(active, g, forward_s, &failed);
  for (const std::vector<size_t>& g : cached_groups) forward_cached_group(active, g, forward_s, &failed);
  std::sort(failed.begin(), failed.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  for (auto& [i, status] : failed) {  // descending indices: retiring one leaves the others' valid
    retire(active, i, step_failure(std::move(status)));
  }
}

// Steps every decoder: those that read one head with others (a batched forward's, a forward of parts') draw
// their tokens in ONE call over all their positions (step_merged), the rest one after another. The lm_head and
// the sampling run on the head's pool (they dominate; the selection after them is cheap). statuses[i] and
// unmasked[i] (positions committed) are active[i]'s.
void Scheduler::step_decoders(std::vector<Active>& active, std::vector<Status>& statuses,
                              std::vector<int64_t>& unmasked) {
  statuses.assign(active.size(), Status());
  unmasked.assign(active.size(), 0);
  const auto masked = [&](size_t i) {
    const Decoder& d = active[i].decoder;
    return std::count(d.canvas().begin(), d.canvas().end(), active[i].job->params().mask_token_id);
  };
  std::vector<int64_t> before(active.size());
  for (size_t i = 0; i < active.size(); ++i) {
    before[i] = masked(i);
    active[i].decoder.set_pool(pool_);
  }
  std::vector<uint8_t> stepped(active.size(), 0);
  step_merged(active, statuses, stepped);
  for (size_t i = 0; i < active.size(); ++i) {
    if (!stepped[i]) statuses[i] = active[i].decoder.step();
    unmasked[i] = before[i] - masked(i);
  }
}

// The decoders that draw from one head with others: their head samplings (each its own rows, filters, kind,
// seed and step) in ascending hidden rows, sampled by one HeadSampler::sample_parts (one lm_head pass; on a
// device one submission), each decoder then stepped with its share; stepped[i] set for each (statuses[i] its
// step's, or the error of its part or of the whole call).
void Scheduler::step_merged(std::vector<Active>& active, std::vector<Status>& statuses, std::vector<uint8_t>& stepped) {
  struct Part {
    size_t job;
    HeadSampling args;
  };
  std::vector<std::pair<HeadSampler*, std::vector<Part>>> heads;
  for (size_t i = 0; i < active.size(); ++i) {
    Active& a = active[i];
    if (a.head == nullptr || !a.decoder.needs_forward()) continue;
    std::optional<HeadSampling> args = a.decoder.head_sampling();
    if (!args || args->rows.empty()) continue;  // a logits_hook: step() samples whole rows
    size_t h = 0;
    while (h < heads.size() && heads[h].first != a.head) ++h;
    if (h == heads.size()) heads.emplace_back(a.head, std::vector<Part>{});
    heads[h].second.push_back(Part{i, *args});
  }
  for (auto& [head, parts] : heads) {
    if (parts.size() < 2) continue;  // alone: step() draws its own
    std::sort(parts.begin(), parts.end(),
              [](const Part& x, const Part& y) { return x.args.rows.front().hidden_row < y.args.rows.front().hidden_row; });
    std::vector<HeadSampling> args;
    size_t total = 0;
    for (const Part& p : parts) args.push_back(p.args), total += p.args.rows.size();
    merged_samples_.resize(total);
    std::vector<Status> part_status(parts.size());
    const Clock::time_point t0 = Clock::now();
    const Status all = head->sample_parts(args, merged_samples_, part_status);
    const double ms = ms_between(t0, Clock::now());
    size_t at = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      const size_t i = parts[k].job, n = parts[k].args.rows.size();
      stepped[i] = 1;
      statuses[i] = !all.ok()              ? all
                    : !part_status[k].ok() ? part_status[k]
                                           : active[i].decoder.step(std::span<const TokenSample>(merged_samples_).subspan(at, n), ms);
      at += n;
    }
  }
}

// Publishes the step's snapshots, retires errors and early stops, and records the step's metrics.
void Scheduler::publish_and_retire(std::vector<Active>& active, const std::vector<Status>& statuses,
                                   const std::vector<int64_t>& unmasked, Clock::time_point t0, double forward_s) {
  int64_t committed = 0, batch_rows = 0;
  for (size_t i = active.size(); i-- > 0;) {
    Active& a = active[i];
    Decoder& d = a.decoder;
    const int32_t mask = a.job->params().mask_token_id;
    batch_rows += d.n_rows();
    if (!statuses[i].ok()) {
      retire(active, i, step_failure(statuses[i]));
      continue;
    }
    committed += unmasked[i];
    if (a.job->publish_steps_) {
      JobSnapshot s{d.steps_done(), d.n_steps(), generated_rows(d)};
      a.job->publish(std::move(s));
    }
    if (all_rows_stopped(d, a.job->stop_ids_, mask)) {
      JobResult r;
      r.stopped_early = true;
      r.generated = generated_rows(d);
      retire(active, i, std::move(r));
    }
  }
  if (metrics_ != nullptr) {
    metrics_->on_step(ms_between(t0, Clock::now()) / 1000.0, forward_s, batch_rows, committed);
    int64_t active_rows = 0;
    for (const Active& a : active) active_rows += a.decoder.n_rows();
    metrics_->set_active_rows(active_rows);
  }
}

}  // namespace dc::api
