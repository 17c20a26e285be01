// Shared by the scheduler tests: a head function whose first forward waits until the test releases it (so that
// the jobs submitted meanwhile join the first one's batch), and the wait for a job's result.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "api/scheduler.h"

namespace dc::server {

// The scheduler moved under the facade (api/, behind diffucoder::BatchEngine); the server tests drive it as before.
using api::Job;
using api::JobResult;
using api::JobSnapshot;
using api::Scheduler;
using api::SchedulerOptions;
using api::SubmitResult;

// A HeadFn wrapper that blocks its first call until release() and records each forward's row count.
class Gate {
 public:
  explicit Gate(HeadFn inner) : inner_(std::move(inner)) {}
  HeadFn fn() {
    return [this](const ForwardBatch& batch) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        entered_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return open_; });
        rows_.push_back(batch.n_batch);
      }
      return inner_(batch);
    };
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::vector<int64_t> rows() {
    std::lock_guard<std::mutex> lock(mu_);
    return rows_;
  }

 private:
  HeadFn inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false;
  std::vector<int64_t> rows_;
};

inline JobResult wait_result(Job& job, std::vector<JobSnapshot>* snapshots = nullptr) {
  JobResult r;
  while (!job.wait(std::chrono::milliseconds(1000), snapshots, &r)) {
  }
  return r;
}

// Submits `jobs` in order, the first holding `gate` (its first forward waits) so that the others join its batch,
// releases the gate and returns each job's result; the scheduler is stopped after. A refused submit fails the
// test and returns no results.
inline std::vector<JobResult> run_gated(Scheduler& scheduler, Gate& gate, const std::vector<std::shared_ptr<Job>>& jobs) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    const SubmitResult submitted = scheduler.submit(jobs[i]);
    EXPECT_EQ(submitted, SubmitResult::kOk) << "job " << i;
    if (submitted != SubmitResult::kOk) {
      gate.release();
      return {};
    }
    if (i == 0) gate.wait_entered();
  }
  gate.release();
  std::vector<JobResult> results;
  for (const auto& j : jobs) results.push_back(wait_result(*j));
  scheduler.stop();
  return results;
}

}  // namespace dc::server
