// Ranks that disagree (issue 41 finding 7): `mpirun` with one command line per rank (MPMD, `:`), where the
// ranks' options or data differ, stops every rank at the start, quickly and with exit code non-zero, naming
// the option and both values; before, a different --lr trained with mixed settings, a different
// --grad-accum hung until --dist-timeout and a different --precision died in MPI_ERR_TRUNCATE. Options that
// may differ per rank (--threads) and the same numbers spelled differently do not count. The settings'
// encoding and comparison (dist/agree.h) are tested without MPI here too. Each run is one tiny step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "dist/agree.h"
#include "fixtures.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {
namespace fs = std::filesystem;

TEST(Settings, EncodeDecodeAndTheFirstDifference) {
  const std::vector<dist::Setting> a = {{"--lr", "0.0001"}, {"--reward-program", "a:b 3:c"}, {"--out", ""}};
  const auto back = dist::decode_settings(dist::encode_settings(a));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[1].value, "a:b 3:c");
  EXPECT_EQ((*back)[2].value, "");
  EXPECT_FALSE(dist::decode_settings("4:--lr9:0.1").ok()) << "a length past the end";
  EXPECT_FALSE(dist::first_difference(a, a).has_value());
  auto b = a;
  b[0].value = "0.0002";
  const auto d = dist::first_difference(a, b);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->root_index, 0u);
  EXPECT_EQ(d->text, "--lr is 0.0002 here but 0.0001 on rank 0");
  b = a;
  b.pop_back();
  const auto missing = dist::first_difference(a, b);
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->root_index, 2u);
  EXPECT_EQ(missing->text, "--out is unknown here but \"\" on rank 0");
  b = a;
  b.push_back({"--new", "1"});
  ASSERT_TRUE(dist::first_difference(a, b).has_value());
  EXPECT_EQ(dist::first_difference(a, b)->root_index, 3u);
  auto one = dist::single_comm();
  EXPECT_TRUE(dist::check_ranks_agree(*one, a).ok());
}

// Under the sanitizers the ranks get OpenMPI's leak suppressions (as train_dist_test.cc); `-x` holds for
// one app context of an MPMD line only, so each gets its own.
std::string ranks_sanitizer_options() {
  const char* asan = std::getenv("ASAN_OPTIONS");
  if (asan == nullptr) return " ";
  return std::string(" -x ASAN_OPTIONS=") + asan + ":fast_unwind_on_malloc=0 -x LSAN_OPTIONS=suppressions=" +
         DC_LSAN_SUPPRESSIONS + " ";
}

using Args = std::map<std::string, std::string>;

class RanksAgree : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir("ranks_agree");
    dir_ = tmp_->path();
    std::ofstream data(dir_ / "sft.jsonl");
    for (int i = 0; i < 4; ++i)
      data << R"({"prompt": "def f)" << i << R"((x):", "completion": "\n    return x * )" << i << "\"}\n";
    data.close();
    fs::copy_file(dir_ / "sft.jsonl", dir_ / "same.jsonl");  // the same contents under another path
    std::ofstream(dir_ / "other.jsonl") << R"({"prompt": "def g(x):", "completion": "\n    return x"})" "\n";
    std::ofstream(dir_ / "grpo.jsonl") << R"({"prompt": "Write f(x).", "tests": ["assert f(1) == 2"]})" "\n";
  }
  static void TearDownTestSuite() { delete tmp_; }

  // Rank 0 runs `rank0`, rank 1 `rank1` (the diffucoder arguments), over loopback; stdout and stderr
  // together. `timeout` bounds a hang (exit 124).
  static testing::RunResult mpmd(const std::string& rank0, const std::string& rank1) {
    const std::string bin = DC_BINARY_PATH;
    testing::RunResult r = testing::run_command(
        "timeout -k 5 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " DC_MPIEXEC
        " --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 1" +
        ranks_sanitizer_options() + bin + " " + rank0 + " : -np 1" + ranks_sanitizer_options() + bin + " " + rank1);
    r.out += r.err;
    return r;
  }
  // The arguments of one tiny step of `train` into dir_/out, each option of `changed` replacing the default.
  static std::string train(const std::string& out, const Args& changed = {}) {
    Args a = {{"--model", testing::fixtures_dir() + "/tiny-vocab"}, {"--data", (dir_ / "sft.jsonl").string()},
              {"--out", (dir_ / out).string()}, {"--steps", "1"}, {"--seq-len", "32"}, {"--batch-size", "1"},
              {"--grad-accum", "2"}, {"--lr", "1e-4"}, {"--threads", "1"}, {"--precision", "f32"}};
    for (const auto& [k, v] : changed) a[k] = v;
    std::string args = "train --instruct-template --quiet";
    for (const auto& [k, v] : a) args += " " + k + " " + v;
    return args;
  }
  static void expect_stopped(const testing::RunResult& r, const std::string& rank1_says, const std::string& rank0_says,
                             const std::string& out) {
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.exit_code, 124) << "hung: " << r.out;
    EXPECT_NE(r.out.find(rank1_says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(rank0_says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("every rank must run with the same options and data"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir_ / out / "checkpoint-000001")) << "it trained";
  }
  static fs::path path(const std::string& name) { return dir_ / name; }
  static inline test::TempDir* tmp_ = nullptr;
  static inline fs::path dir_;
};

TEST_F(RanksAgree, ADifferentLearningRateStopsEveryRank) {
  const auto r = mpmd(train("lr"), train("lr", {{"--lr", "2e-4"}}));
  expect_stopped(r, "rank 1: --lr is 0.0002 here but 0.0001 on rank 0", "rank 0: other settings on rank 1 (--lr, 0.0001 on rank 0)",
                 "lr");
}

TEST_F(RanksAgree, ADifferentGradAccumStopsInsteadOfHanging) {
  const auto r = mpmd(train("accum"), train("accum", {{"--grad-accum", "4"}}));
  expect_stopped(r, "rank 1: --grad-accum is 4 here but 2 on rank 0", "(--grad-accum, 2 on rank 0)", "accum");
}

TEST_F(RanksAgree, ADifferentPrecisionStopsEveryRank) {
  const auto r = mpmd(train("precision"), train("precision", {{"--precision", "bf16"}}));
  expect_stopped(r, "rank 1: --precision is bf16 here but f32 on rank 0", "(--precision, f32 on rank 0)", "precision");
}

TEST_F(RanksAgree, DifferentDataStopsEveryRank) {
  const auto r = mpmd(train("data"), train("data", {{"--data", path("other.jsonl").string()}}));
  expect_stopped(r, "rank 1: --data (its contents) is ", "(--data (its contents), ", "data");
  EXPECT_NE(r.out.find(" bytes, hash "), std::string::npos) << r.out;
}

// The same run spelled differently: another path to the same data, 1e-4 as 0.0001, other --threads.
TEST_F(RanksAgree, TheSameRunSpelledDifferentlyTrains) {
  const auto r = mpmd(train("same"), train("same", {{"--lr", "0.0001"}, {"--threads", "2"}, {"--dist-timeout", "300"},
                                                         {"--data", path("same.jsonl").string()}}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "same" / "checkpoint-000001")) << r.out;
}

TEST_F(RanksAgree, GrpoRanksCompareTheirOptionsToo) {
  const auto grpo = [](const std::string& generations) {
    return "grpo --model " + testing::fixtures_dir() + "/tiny-vocab --data " + path("grpo.jsonl").string() +
           " --out " + path("grpo").string() + " --num-generations " + generations + " --prompts-per-round 2 "
           "--steps 2 --max-completion-length 4 --diffusion-steps 4 --threads 1 --quiet";
  };
  const auto r = mpmd(grpo("2"), grpo("4"));
  expect_stopped(r, "rank 1: --num-generations is 4 here but 2 on rank 0", "(--num-generations, 2 on rank 0)", "grpo");
}

}  // namespace
}  // namespace dc
