// RewardScorer: score_completions over the chunks of a round, in order, on one worker thread or inline.
#include "train/reward_scorer.h"

#include <chrono>
#include <new>
#include <utility>

namespace dc::train {

RewardScorer::RewardScorer(RewardOptions options, bool overlap) : options_(std::move(options)), overlap_(overlap) {
  if (overlap) worker_ = std::thread([this] { work(); });
}

RewardScorer::~RewardScorer() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  changed_.notify_all();
  worker_.join();
}

void RewardScorer::score(Chunk chunk) {
  Result<RewardBatch> r = [&]() -> Result<RewardBatch> {
    try {
      return score_completions(chunk.inputs, options_);
    } catch (const std::bad_alloc&) {
      return resource_exhausted("out of memory");
    }
  }();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.ok()) return;
  if (!r.ok()) {
    error_ = r.status().with_context("the rewards of " + chunk.what);
    return;
  }
  auto append = [](auto& into, auto& from) { into.insert(into.end(), from.begin(), from.end()); };
  append(batch_.code_format, r->code_format);
  append(batch_.code, r->code);
  append(batch_.user, r->user);
  append(batch_.total, r->total);
  batch_.seconds += r->seconds;
}

void RewardScorer::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Chunk chunk = std::move(queue_.front());
    queue_.pop_front();
    const bool failed = !error_.ok();  // an earlier chunk failed: the round has no rewards, run nothing more
    busy_ = true;
    lock.unlock();
    if (!failed) score(std::move(chunk));
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

Status RewardScorer::submit(std::vector<RewardInput> inputs, std::string what) {
  Chunk chunk{std::move(inputs), std::move(what)};
  if (!overlap_) {
    if (error_.ok()) score(std::move(chunk));
    return error_;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(chunk));
  changed_.notify_all();
  return error_;
}

Result<RewardBatch> RewardScorer::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  if (overlap_) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!error_.ok()) return error_;
  return std::move(batch_);
}

}  // namespace dc::train
