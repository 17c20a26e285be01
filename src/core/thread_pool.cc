// ThreadPool: workers pull chunks from a shared counter under one mutex (chunks are coarse); a second
// mutex lets one parallel_for at a time own the job state.
#include "core/thread_pool.h"

#include <algorithm>
#include <utility>

namespace dc {

namespace {
// The pool whose chunk this thread is running (a worker's, or a caller's own), so that a nested
// parallel_for runs inline instead of waiting for workers that are busy with its parent.
// t_running_index is this thread's index in it (ThreadPool::thread_index).
thread_local const ThreadPool* t_running_pool = nullptr;
thread_local int t_running_index = 0;

struct RunningPool {
  RunningPool(const ThreadPool* pool, int index) : saved(t_running_pool), saved_index(t_running_index) {
    t_running_pool = pool;
    t_running_index = index;
  }
  ~RunningPool() {
    t_running_pool = saved;
    t_running_index = saved_index;
  }
  const ThreadPool* saved;
  int saved_index;
};
}  // namespace

int ThreadPool::thread_index() { return t_running_index; }

void ThreadPool::run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t begin, int64_t end,
                           std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  std::exception_ptr error;
  try {
    fn(begin, end);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  if (error) {
    if (!error_) error_ = error;
    next_ = job_n_;  // no new chunks
  }
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t threads = n_threads();
  int64_t chunk = std::max<int64_t>(min_chunk, (n + threads * 4 - 1) / (threads * 4));
  if (threads == 1 || chunk >= n || t_running_pool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  RunningPool running(this, 0);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_ = 0;
  pending_ = static_cast<int>(workers_.size());
  ++generation_;
  cv_start_.notify_all();
  while (next_ < job_n_) {
    const int64_t b = next_;
    next_ = std::min(job_n_, b + job_chunk_);
    run_chunk(fn, b, next_, lock);
  }
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::worker_loop(int index) {
  RunningPool running(this, index);
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_ < job_n_) {
      const int64_t b = next_;
      next_ = std::min(job_n_, b + job_chunk_);
      run_chunk(*job_, b, next_, lock);
    }
    if (--pending_ == 0) cv_done_.notify_one();
  }
}

}  // namespace dc
