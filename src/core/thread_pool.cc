// ThreadPool: workers pull chunks from a shared counter under one mutex (chunks are coarse).
#include "core/thread_pool.h"

#include <algorithm>

namespace dc {

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
  if (threads == 1 || chunk >= n) {
    fn(0, n);
    return;
  }
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
    const int64_t e = next_;
    lock.unlock();
    fn(b, e);
    lock.lock();
  }
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_ < job_n_) {
      const int64_t b = next_;
      next_ = std::min(job_n_, b + job_chunk_);
      const int64_t e = next_;
      const auto* fn = job_;
      lock.unlock();
      (*fn)(b, e);
      lock.lock();
    }
    if (--pending_ == 0) cv_done_.notify_one();
  }
}

}  // namespace dc
