// The log callback of the public API (diffucoder::set_log_callback over core/log.h): the library's "note:"
// lines reach the program's callback with their level instead of stderr, from any thread, and the default
// comes back when the callback is cleared.
#include <gtest/gtest.h>

#include <diffucoder/diffucoder.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.h"
#include "fixtures.h"
#include "ops/cpu/kernels.h"
#include "temp_dir.h"

namespace {

// Collects (level, message) pairs; installed for the scope of one test and cleared after it.
class CollectedLog {
 public:
  CollectedLog() {
    diffucoder::set_log_callback([this](diffucoder::LogLevel level, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(level, std::string(message));
    });
  }
  ~CollectedLog() { diffucoder::set_log_callback(nullptr); }
  std::vector<std::pair<diffucoder::LogLevel, std::string>> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // The messages of `level` that contain `text`.
  int count(diffucoder::LogLevel level, const std::string& text) {
    int n = 0;
    for (const auto& [l, m] : lines()) n += l == level && m.find(text) != std::string::npos;
    return n;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<diffucoder::LogLevel, std::string>> lines_;
};

TEST(ApiLog, CallbackGetsEachLevelAndClearingRestoresStderr) {
  {
    CollectedLog log;
    dc::log(dc::LogLevel::kWarning, "a note");
    dc::log(dc::LogLevel::kInfo, "some progress");
    dc::log(dc::LogLevel::kError, "a failed cleanup");
    const auto lines = log.lines();
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[0], std::make_pair(diffucoder::LogLevel::kWarning, std::string("a note")));
    EXPECT_EQ(lines[1], std::make_pair(diffucoder::LogLevel::kInfo, std::string("some progress")));
    EXPECT_EQ(lines[2], std::make_pair(diffucoder::LogLevel::kError, std::string("a failed cleanup")));
  }
  // Cleared: back on stderr, as the CLI prints it.
  ::testing::internal::CaptureStderr();
  dc::log(dc::LogLevel::kWarning, "after clearing");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "note: after clearing\n");
  EXPECT_EQ(dc::format_log_line(dc::LogLevel::kError, "x"), "error: x");
  EXPECT_EQ(dc::format_log_line(dc::LogLevel::kInfo, "x"), "x");
}

// Threads log while the callback is replaced over and over: every message reaches one of the callbacks,
// none is lost or delivered twice, and a callback may log itself without deadlocking.
TEST(ApiLog, MessagesFromManyThreadsWhileTheCallbackChanges) {
  std::atomic<int> delivered{0};
  auto counting = [&delivered](diffucoder::LogLevel, std::string_view m) {
    if (m == "nested") return;
    delivered.fetch_add(1);
    if (m == "t0 7") dc::log(dc::LogLevel::kDebug, "nested");  // re-entrant
  };
  constexpr int kThreads = 4, kEach = 200;
  diffucoder::set_log_callback(counting);
  std::atomic<bool> done{false};
  std::thread swapper([&] {
    while (!done.load()) diffucoder::set_log_callback(counting);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < kEach; ++i) dc::log(dc::LogLevel::kWarning, "t" + std::to_string(t) + " " + std::to_string(i));
    });
  for (auto& th : threads) th.join();
  done = true;
  swapper.join();
  diffucoder::set_log_callback(nullptr);
  EXPECT_EQ(delivered.load(), kThreads * kEach);
}

// The trainer's note (bf16 asked for, no AVX512_BF16 kernels: training in f32) comes through the callback,
// not stderr. The portable kernels stand in for a CPU without AVX512_BF16.
TEST(ApiLog, TrainerNoteReachesTheCallback) {
  const dc::test::TempDir tmp("api_log_train");
  const std::filesystem::path data = std::filesystem::path(tmp.path()) / "sft.jsonl";
  std::ofstream(data) << R"({"prompt": "def f(x):", "completion": "\n    return x\n"})" << "\n";
  diffucoder::TrainConfig c;
  c.model_dir = dc::testing::fixtures_dir() + "/tiny-vocab";
  c.data_path = data.string();
  c.seq_len = 16, c.batch_size = 1, c.steps = 1, c.threads = 1, c.precision = "bf16";
  CollectedLog log;
  dc::cpu::force_portable_kernels_for_testing(true);
  ::testing::internal::CaptureStderr();
  auto trainer = diffucoder::Trainer::create(c);
  const std::string err = ::testing::internal::GetCapturedStderr();
  dc::cpu::force_portable_kernels_for_testing(false);
  ASSERT_TRUE(trainer.ok()) << trainer.status().to_string();
  EXPECT_EQ((*trainer)->precision(), "f32");
  EXPECT_EQ(log.count(diffucoder::LogLevel::kWarning, "no AVX512_BF16"), 1);
  EXPECT_EQ(err.find("AVX512_BF16"), std::string::npos) << err;
}

// The packed-weight cache's note: a cache that cannot be written (its directory is a regular file) is said
// when the model closes, through the callback.
TEST(ApiLog, UnwrittenWeightCacheNoteReachesTheCallback) {
  if (!dc::cpu::cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512_BF16: bf16 weights are not packed on this CPU";
  const dc::test::TempDir tmp("api_log_cache");
  const std::filesystem::path not_a_dir = std::filesystem::path(tmp.path()) / "a-file";
  std::ofstream(not_a_dir) << "x";
  CollectedLog log;
  {
    diffucoder::LoadOptions o;
    o.model_dir = dc::testing::fixtures_dir() + "/tiny-gqa4-bf16";
    o.threads = 2;
    o.weight_cache = not_a_dir.string();
    auto model = diffucoder::Model::load(o);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
  }
  EXPECT_EQ(log.count(diffucoder::LogLevel::kWarning, "the packed-weight cache was not written"), 1);
}

}  // namespace
