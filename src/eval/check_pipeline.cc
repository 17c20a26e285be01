#include "eval/check_pipeline.h"

namespace dc::eval {

CheckPipeline::CheckPipeline(const std::map<std::string, const Task*>& tasks, const CheckOptions& options,
                             int workers, std::function<Status(const SampleRecord&)> on_record, const PlanMap& plans,
                             size_t max_waiting)
    : tasks_(tasks),
      options_(options),
      workers_(workers),
      on_record_(std::move(on_record)),
      plans_(plans),
      max_waiting_(std::max<size_t>(1, max_waiting)),
      thread_([this] { loop(); }) {}

CheckPipeline::~CheckPipeline() { (void)finish(); }

Status CheckPipeline::submit(std::vector<Sample> batch) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return waiting_.size() < max_waiting_ || !error_.ok(); });
  if (!error_.ok()) return error_;
  waiting_.push_back(std::move(batch));
  changed_.notify_all();
  return Status::ok_status();
}

Status CheckPipeline::finish() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return (waiting_.empty() && !busy_) || !error_.ok(); });
    closing_ = true;
    changed_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CheckPipeline::loop() {
  for (;;) {
    std::vector<Sample> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return !waiting_.empty() || closing_; });
      if (waiting_.empty() || !error_.ok()) return;
      batch = std::move(waiting_.front());
      waiting_.pop_front();
      busy_ = true;
      changed_.notify_all();
    }
    Status s = check_samples(batch, tasks_, options_, workers_, on_record_, plans_);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    if (!s.ok() && error_.ok()) error_ = s;
    changed_.notify_all();
  }
}

}  // namespace dc::eval
