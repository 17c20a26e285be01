// Scheduler: the engine thread. Each step admits queued jobs that fit, prepares every active Decoder, runs ONE
// forward over the rows of all decoders that need logits (left-padded to the longest canvas), scatters the
// logits back, steps every decoder, publishes snapshots and retires finished, stopped or cancelled jobs.
#include "server/scheduler.h"

#include <malloc.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/thread_pool.h"
#include "sampler/decoder.h"

namespace dc::server {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t canvas_of(const Job& job) {
  return static_cast<int64_t>(job.prompt().size()) + job.params().max_new_tokens.value_or(20);
}

}  // namespace

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

void Job::publish(JobSnapshot snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  snapshots_.push_back(std::move(snapshot));
  cv_.notify_all();
}

void Job::finish(JobResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  result_ = std::move(result);
  finished_ = true;
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------------
// Scheduler

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  Decoder decoder;
  Clock::time_point started;
};

Scheduler::Scheduler(LogitsFn logits_fn, int64_t n_vocab, ThreadPool* pool, SchedulerOptions options,
                     Metrics* metrics)
    : logits_fn_(std::move(logits_fn)), n_vocab_(n_vocab), pool_(pool), options_(options), metrics_(metrics) {
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

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
      r.status = job.cancelled() ? internal_error("cancelled while queued")
                                 : out_of_range("queue: waited longer than the server's queue time limit");
      r.queue_ms = waited_ms;
      job.finish(std::move(r));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  int64_t rows = 0, width = 0;
  for (const Active& a : active) {
    rows += a.decoder.n_rows();
    width = std::max(width, a.decoder.n_seq());
  }
  while (!queue_.empty()) {
    std::shared_ptr<Job> job = queue_.front();
    const int64_t w = std::max(width, canvas_of(*job));
    if (rows + job->n_rows() > options_.max_batch_rows || (rows + job->n_rows()) * w > options_.max_batch_positions)
      break;
    queue_.pop_front();
    job->admitted_ = Clock::now();
    GenerateHooks hooks;
    hooks.pool = pool_;  // set per step in step_batch()
    bool unavailable = false;
    Result<Decoder> decoder = unimplemented("cache: the server runs without the KV cache");
    if (job->params().cache == CacheMode::kNone) {
      try {
        decoder = Decoder::start(n_vocab_, {job->prompt()}, job->params(), hooks);
      } catch (const std::bad_alloc&) {
        decoder = out_of_range("out of memory while starting the generation; retry later or ask for fewer tokens");
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
    job->set_admitted();
    active.push_back(Active{job, std::move(*decoder), Clock::now()});
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
    } catch (const std::bad_alloc&) {
      for (Active& a : active) {
        JobResult r;
        r.status = out_of_range("out of memory on the engine thread; retry later or ask for fewer tokens or rows");
        r.unavailable = true;
        a.job->finish(std::move(r));
      }
      active.clear();
    }
    if (active.empty()) {  // idle: hand the step buffers of the last batch back to the system
      std::vector<float>().swap(logits_);
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
  auto retire = [&](size_t i, JobResult r) {
    Active& a = active[i];
    const Clock::time_point now = Clock::now();
    r.queue_ms = ms_between(a.job->submitted_, a.job->admitted_);
    r.run_ms = ms_between(a.started, now);
    r.timings = a.decoder.timings();
    if (metrics_ != nullptr) metrics_->on_job_done(r.queue_ms / 1000.0, r.run_ms / 1000.0);
    a.job->finish(std::move(r));
    active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
  };
  auto generated_rows = [](const Decoder& d) {
    std::vector<std::vector<int32_t>> rows;
    const std::span<const int32_t> canvas = d.canvas();
    for (int64_t b = 0; b < d.n_rows(); ++b) {
      const auto row = canvas.begin() + b * d.n_seq();
      rows.emplace_back(row + d.prompt_width(), row + d.n_seq());
    }
    return rows;
  };

  // Retire cancelled and finished jobs; prepare the rest.
  for (size_t i = active.size(); i-- > 0;) {
    Active& a = active[i];
    if (a.job->cancelled()) {
      JobResult r;
      r.status = internal_error("cancelled: the client went away");
      retire(i, std::move(r));
      continue;
    }
    a.decoder.prepare();
    if (a.decoder.done()) {
      JobResult r;
      r.generated = generated_rows(a.decoder);
      retire(i, std::move(r));
    }
  }
  if (active.empty()) return;

  // One forward over every row that needs logits, left-padded to the widest canvas.
  int64_t rows = 0, width = 0, n_out = 0;
  std::vector<size_t> forward_jobs;
  for (size_t i = 0; i < active.size(); ++i) {
    if (!active[i].decoder.needs_forward()) continue;
    const ForwardBatch fb = active[i].decoder.forward_batch();
    forward_jobs.push_back(i);
    rows += fb.n_batch;
    width = std::max(width, fb.n_seq);
    n_out += fb.n_out;
  }
  double forward_s = 0.0;
  if (forward_jobs.size() == 1) {  // one job: its own batch, straight into its buffer (no padding, no copy)
    Decoder& d = active[forward_jobs[0]].decoder;
    const ForwardBatch fb = d.forward_batch();
    const Clock::time_point tf = Clock::now();
    const Status st = logits_fn_(fb, d.logits_buffer().data());
    forward_s = ms_between(tf, Clock::now()) / 1000.0;
    d.record_forward(forward_s * 1000.0, fb.n_computed());
    if (!st.ok()) {
      JobResult r;
      r.status = st.with_context("forward");
      r.model_error = true;
      retire(forward_jobs[0], std::move(r));
      return;
    }
  } else if (!forward_jobs.empty()) {
    std::vector<int32_t> tokens(static_cast<size_t>(rows * width), 0);
    std::vector<uint8_t> valid(tokens.size(), 0);
    std::vector<int32_t> positions(tokens.size(), 1);
    std::vector<int64_t> out_rows;
    out_rows.reserve(static_cast<size_t>(n_out));
    bool padded = false;
    int64_t row0 = 0;
    for (size_t i : forward_jobs) {
      const ForwardBatch fb = active[i].decoder.forward_batch();
      const int64_t pad = width - fb.n_seq;
      padded |= pad > 0 || fb.valid != nullptr;
      for (int64_t b = 0; b < fb.n_batch; ++b) {
        const size_t dst = static_cast<size_t>((row0 + b) * width + pad);
        const size_t src = static_cast<size_t>(b * fb.n_seq);
        std::memcpy(tokens.data() + dst, fb.tokens + src, static_cast<size_t>(fb.n_seq) * sizeof(int32_t));
        for (int64_t j = 0; j < fb.n_seq; ++j) {
          valid[dst + j] = fb.valid != nullptr ? fb.valid[src + j] : 1;
          positions[dst + j] = fb.positions != nullptr ? fb.positions[src + j] : static_cast<int32_t>(j);
        }
      }
      for (int64_t o = 0; o < fb.n_out; ++o) {
        const int64_t b = fb.out_rows[o] / fb.n_seq, j = fb.out_rows[o] % fb.n_seq;
        out_rows.push_back((row0 + b) * width + pad + j);
      }
      row0 += fb.n_batch;
    }
    ForwardBatch batch;
    batch.n_batch = rows;
    batch.n_seq = width;
    batch.tokens = tokens.data();
    batch.valid = padded ? valid.data() : nullptr;
    batch.positions = padded ? positions.data() : nullptr;
    batch.out_rows = out_rows.data();
    batch.n_out = n_out;
    std::vector<float>& logits = logits_;
    logits.resize(static_cast<size_t>(n_out * n_vocab_));
    const Clock::time_point tf = Clock::now();
    const Status st = logits_fn_(batch, logits.data());
    forward_s = ms_between(tf, Clock::now()) / 1000.0;
    int64_t out0 = 0;
    for (size_t i : forward_jobs) {
      Decoder& d = active[i].decoder;
      const ForwardBatch fb = d.forward_batch();
      if (st.ok()) {
        const std::span<float> dst = d.logits_buffer();
        std::memcpy(dst.data(), logits.data() + out0 * n_vocab_, dst.size() * sizeof(float));
      }
      out0 += fb.n_out;
      d.record_forward(forward_s * 1000.0, fb.n_computed());
    }
    if (!st.ok()) {  // the model failed: every job of this forward fails
      for (size_t k = forward_jobs.size(); k-- > 0;) {
        JobResult r;
        r.status = st.with_context("forward");
        r.model_error = true;
        retire(forward_jobs[k], std::move(r));
      }
      return;
    }
  }

  // Step every decoder: alone, with the pool inside its sampling; several, in parallel over the pool
  // (each serial inside). Then publish and retire errors and early stops.
  const size_t n_active = active.size();
  std::vector<Status> statuses(n_active);
  std::vector<int64_t> unmasked(n_active, 0);
  auto step_range = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      Decoder& d = active[static_cast<size_t>(i)].decoder;
      const int32_t mask = active[static_cast<size_t>(i)].job->params().mask_token_id;
      const int64_t before = std::count(d.canvas().begin(), d.canvas().end(), mask);
      statuses[static_cast<size_t>(i)] = d.step();
      unmasked[static_cast<size_t>(i)] = before - std::count(d.canvas().begin(), d.canvas().end(), mask);
    }
  };
  if (n_active == 1 || pool_ == nullptr) {
    for (Active& a : active) a.decoder.set_pool(n_active == 1 ? pool_ : nullptr);
    step_range(0, static_cast<int64_t>(n_active));
  } else {
    for (Active& a : active) a.decoder.set_pool(nullptr);
    pool_->parallel_for(static_cast<int64_t>(n_active), step_range, 1);
  }
  int64_t committed = 0, batch_rows = 0;
  for (size_t i = active.size(); i-- > 0;) {
    Active& a = active[i];
    Decoder& d = a.decoder;
    const int32_t mask = a.job->params().mask_token_id;
    batch_rows += d.n_rows();
    if (!statuses[i].ok()) {
      JobResult r;
      r.status = statuses[i];
      r.model_error = true;  // the sampler refused the model's logits (non-finite values)
      retire(i, std::move(r));
      continue;
    }
    committed += unmasked[i];
    if (a.job->publish_steps_) {
      JobSnapshot s{d.steps_done(), d.n_steps(), generated_rows(d)};
      a.job->publish(std::move(s));
    }
    // Early stop: every row's final prefix (unmasked from the left) contains a stop id.
    const std::vector<int32_t>& stop_ids = a.job->stop_ids_;
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
    if (all_stopped) {
      JobResult r;
      r.stopped_early = true;
      r.generated = generated_rows(d);
      retire(i, std::move(r));
    }
  }
  if (metrics_ != nullptr) {
    metrics_->on_step(ms_between(t0, Clock::now()) / 1000.0, forward_s, batch_rows, committed);
    int64_t active_rows = 0;
    for (const Active& a : active) active_rows += a.decoder.n_rows();
    metrics_->set_active_rows(active_rows);
  }
}

}  // namespace dc::server
