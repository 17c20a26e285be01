// RewardScorer (train/reward_scorer.h): a round's rewards scored chunk by chunk on a worker thread equal the
// sequential scorer's and score_completions' over the whole round, in order; a failing chunk is named and stops
// the round; a scorer destroyed mid-round leaves no thread or reward program running.
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "sandbox/sandbox.h"
#include "temp_dir.h"
#include "train/reward_scorer.h"

namespace dc::train {
namespace {

std::string scorer_script_path() { return std::string(DC_SOURCE_DIR) + "/tests/train/user_reward_script.py"; }

// The user program's scores, by `mode` of tests/train/user_reward_script.py (then `arg`).
RewardOptions user_reward(const std::string& mode, const std::string& arg = "") {
  RewardOptions o;
  o.code_weight = 0, o.format_weight = 0, o.user_weight = 0.5;
  o.user.argv = {"/usr/bin/python3", scorer_script_path(), mode};
  if (!arg.empty()) o.user.argv.push_back(arg);
  return o;
}

std::vector<RewardInput> inputs(const GrpoExample& example, const std::vector<std::string>& completions) {
  std::vector<RewardInput> v;
  for (const std::string& c : completions) v.push_back({&example, "prompt", c});
  return v;
}

TEST(RewardScorer, ChunksOverlappedEqualSequentialAndTheWholeRound) {
  GrpoExample example;
  example.tests = {"assert f(1) == 2"};
  example.fields = {{"bonus", 100}};
  RewardOptions o = user_reward("length");
  const bool sandboxed = sandbox::check_available().ok();  // then the code and format rewards too
  if (sandboxed) o.code_weight = 2.0, o.format_weight = 0.5, o.code.workers = 2, o.code.timeout_seconds = 5;
  const std::vector<std::vector<std::string>> chunks = {
      {"```python\ndef f(x):\n    return x + 1\n```\n", "no code"},
      {"```python\ndef f(x):\n    return x - 1\n```\n", "```python\ndef f(x) return\n```\n"},
      {"x"}};
  std::vector<std::string> all;
  for (const auto& c : chunks) all.insert(all.end(), c.begin(), c.end());
  auto whole = score_completions(inputs(example, all), o);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  if (sandboxed) {
    EXPECT_EQ(whole->code_format, (std::vector<double>{1.0, 0.0, 1.0, 0.5, 0.0}));
  }
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "sequential");
    RewardScorer scorer(o, overlap);
    for (size_t c = 0; c < chunks.size(); ++c) ASSERT_TRUE(scorer.submit(inputs(example, chunks[c]), "chunk").ok());
    auto b = scorer.finish();
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ(b->total, whole->total);
    EXPECT_EQ(b->user, whole->user);
    EXPECT_EQ(b->code_format, whole->code_format);
    ASSERT_EQ(b->code.size(), whole->code.size());
    for (size_t i = 0; i < b->code.size(); ++i) EXPECT_EQ(b->code[i].reward, whole->code[i].reward) << i;
    EXPECT_GT(b->seconds, 0.0);
    EXPECT_GE(scorer.wait_seconds(), 0.0);
  }
}

TEST(RewardScorer, AFailingChunkIsNamedAndEndsTheRound) {
  GrpoExample example;
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "sequential");
    RewardScorer scorer(user_reward("fail_on_bad"), overlap);
    ASSERT_TRUE(scorer.submit(inputs(example, {"a", "bb"}), "the completions of prompts 0-0").ok());
    const Status s = scorer.submit(inputs(example, {"bad"}), "the completions of prompts 1-1");
    if (!overlap) {
      EXPECT_FALSE(s.ok()) << "sequential: the error at once";
    }
    (void)scorer.submit(inputs(example, {"ccc"}), "the completions of prompts 2-2");
    auto b = scorer.finish();
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("the rewards of the completions of prompts 1-1"), std::string::npos)
        << b.status().message();
    EXPECT_NE(b.status().message().find("a bad completion"), std::string::npos) << b.status().message();
  }
}

TEST(RewardScorer, DestroyedMidRoundWaitsForItsProgramAndDropsTheQueue) {
  const test::TempDir tmp("reward_scorer");
  const std::string pids = (std::filesystem::path(tmp.path()) / "pids").string();
  GrpoExample example;
  const auto t0 = std::chrono::steady_clock::now();
  {
    RewardScorer scorer(user_reward("slow_pid", pids), /*overlap=*/true);
    for (int c = 0; c < 3; ++c) ASSERT_TRUE(scorer.submit(inputs(example, {"a"}), "chunk " + std::to_string(c)).ok());
    // Let the worker start the first chunk's program, then leave without finish().
    for (int i = 0; i < 500 && !std::ifstream(pids).good(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream in(pids);
  std::vector<long> started;
  for (long pid; in >> pid;) started.push_back(pid);
  ASSERT_EQ(started.size(), 1u) << "the queued chunks ran";
  EXPECT_GE(seconds, 1.0) << "the destructor did not wait for the chunk being scored";
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(::kill(static_cast<pid_t>(started[0]), 0), -1) << "the reward program still runs";
  EXPECT_EQ(errno, ESRCH);
}

}  // namespace
}  // namespace dc::train
