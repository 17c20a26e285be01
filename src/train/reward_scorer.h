// RewardScorer: a round's rewards (rewards.h score_completions) scored chunk by chunk, on a worker thread of
// its own when overlapped, so that the sandboxed runs of the completions already generated go on while the
// caller generates the next chunk of the round's rollouts and computes the round's no-gradient passes (all of
// which need the completions, none the rewards). Sequential, the same scores at the same points of the run.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "train/rewards.h"

namespace dc::train {

class RewardScorer {
 public:
  // overlap: score on a worker thread (started here); else in submit(), on the caller's thread.
  RewardScorer(RewardOptions options, bool overlap);
  // Waits for the chunk being scored (its sandboxed runs end within their limits and are reaped) and drops
  // the queued ones: no thread or child process outlives the scorer, whatever error ended the round.
  ~RewardScorer();
  RewardScorer(const RewardScorer&) = delete;
  RewardScorer& operator=(const RewardScorer&) = delete;

  // Scores `inputs` (their examples must outlive the scorer), named `what` in an error (e.g. "the completions
  // of prompts 2-3 of round 5"). Returns the first error of the chunks scored so far (sequential: this
  // one's), so that a caller stops generating once the round's rewards have failed.
  Status submit(std::vector<RewardInput> inputs, std::string what);
  // Waits for every chunk submitted; their scores concatenated in submission order (seconds: the sum of the
  // chunks' scoring times), or the first chunk's error with its name. Call once.
  Result<RewardBatch> finish();
  // The seconds finish() waited for the worker: the scoring not hidden behind the caller's work.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Chunk {
    std::vector<RewardInput> inputs;
    std::string what;
  };
  void score(Chunk chunk);  // into batch_ / error_ (under mutex_ when overlapped)
  void work();              // the worker thread's loop

  const RewardOptions options_;
  const bool overlap_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Chunk> queue_;    // submitted, not yet scored (overlapped)
  bool busy_ = false;          // the worker is scoring a chunk
  bool stopping_ = false;      // the destructor: the worker leaves after its chunk
  RewardBatch batch_;          // the chunks' scores so far, in order
  Status error_;               // the first chunk that failed
  double wait_seconds_ = 0;
  std::thread worker_;         // overlapped only; last member: started after the rest exists
};

}  // namespace dc::train
