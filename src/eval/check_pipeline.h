// Checking that overlaps generation: the caller hands over each generated batch of samples and goes on to
// decode the next while a background thread checks this one in the sandbox pool (check_samples). The queue
// of batches waiting is bounded, so a generator faster than the checks waits instead of piling up samples.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "eval/run.h"

namespace dc::eval {

class CheckPipeline {
 public:
  // The arguments of check_samples; `tasks` and `plans` must outlive the pipeline. on_record is called from
  // the checking threads, one call at a time. At most `max_waiting` (>= 1) batches wait behind the one being
  // checked.
  CheckPipeline(const std::map<std::string, const Task*>& tasks, const CheckOptions& options, int workers,
                std::function<Status(const SampleRecord&)> on_record, const PlanMap& plans, size_t max_waiting = 1);
  ~CheckPipeline();  // finish(), its error dropped
  CheckPipeline(const CheckPipeline&) = delete;
  CheckPipeline& operator=(const CheckPipeline&) = delete;

  // Queues a batch (blocks while max_waiting batches wait). Returns the first error of an earlier batch, if
  // any: the batch is then not queued, and nothing more is checked.
  Status submit(std::vector<Sample> batch);
  // Waits until every queued batch is checked; the first error (a sandbox failure or on_record's), if any.
  Status finish();

 private:
  void loop();

  const std::map<std::string, const Task*>& tasks_;
  const CheckOptions options_;
  const int workers_;
  const std::function<Status(const SampleRecord&)> on_record_;
  const PlanMap& plans_;
  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::vector<Sample>> waiting_;  // guarded by mu_
  bool busy_ = false, closing_ = false;      // guarded by mu_
  Status error_ = Status::ok_status();       // guarded by mu_: the first error
  std::thread thread_;
};

}  // namespace dc::eval
