// A fixed pool of worker threads with a blocking parallel_for. Safe to share between threads: concurrent
// parallel_for calls take the workers one call at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dc {

// The most threads a caller may ask a pool for (the CLI's --threads, the facade's LoadOptions::threads).
inline constexpr int kMaxThreads = 1024;

class ThreadPool {
 public:
  // n_threads <= 0 picks the number of hardware threads. The calling thread works too.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // The calling thread's index in the pool whose chunk it is running: 1 .. n_threads()-1 for a worker,
  // 0 for the thread that called parallel_for, and 0 outside any parallel_for. The threads running the
  // chunks of one call have distinct indices (per-thread scratch is keyed by it, core/workspace.h).
  static int thread_index();

  // Splits [0, n) into contiguous chunks of at least `min_chunk` and calls fn(begin, end) on them
  // from all threads; returns when every chunk is done. Thread-safe: calls from several threads are
  // serialised (each waits for the workers while another call holds them; the chunks of one call
  // never run concurrently with another's). A parallel_for called from inside fn runs serially on the
  // calling thread. An exception thrown by fn (e.g. std::bad_alloc from scratch) on any thread stops the
  // chunks not yet started and is rethrown to the caller once the others are done.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

 private:
  void worker_loop(int index);
  // Runs fn(begin, end) with `lock` (on mu_) released, recording an exception as the job's error.
  void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t begin, int64_t end,
                 std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // held by the one parallel_for that owns the workers
  std::mutex mu_;       // guards the job state below
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 1, next_ = 0;
  std::exception_ptr error_;  // the first exception of the current job
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace dc

namespace dc {

// pool->parallel_for(n, fn, min_chunk), or fn(0, n) on the calling thread when pool is null.
inline void parallel_for(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                         int64_t min_chunk = 1) {
  if (pool != nullptr) {
    pool->parallel_for(n, fn, min_chunk);
  } else if (n > 0) {
    fn(0, n);
  }
}

}  // namespace dc
