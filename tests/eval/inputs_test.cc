// eval's hostile inputs (issue 41, probe findings 9 and 10): numeric flags out of range (a 1e30 / inf /
// NaN timeout, a --memory-mb that overflows) are usage errors naming the flag and the range; a gzip bomb
// is refused naming the file and the size limit; invalid UTF-8 is reported as such with its line; a
// results file holding records of other tasks or sample numbers past the run's is refused on --resume,
// naming the line.
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "eval/humaneval.h"
#include "eval/run.h"
#include "process.h"
#include "sandbox/sandbox.h"
#include "temp_dir.h"

namespace dc::eval::inputs {
namespace {

const std::string kHumanEval = std::string(DC_SOURCE_DIR) + "/data/humaneval/HumanEval.jsonl.gz";
const std::string kTask = R"({"task_id": "x/0", "prompt": "def f():\n", "entry_point": "f", "test": "def check(c): pass"})";

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(EvalFlags, OutOfRangeNumbersAreUsageErrors) {
  const test::TempDir dir("eval_inputs");
  write(dir.file("c.jsonl"), R"({"task_id": "HumanEval/0", "completion": "    return True\n"})" "\n");
  const std::string base = "eval --benchmark " + kHumanEval + " --completions " + dir.file("c.jsonl") + " --out " +
                           dir.file("r.jsonl") + " --quiet ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--timeout 1e30", "--timeout must be in (0, 3600]"},
      {"--timeout inf", "--timeout"},
      {"--timeout nan", "--timeout"},
      {"--timeout 0", "--timeout must be in (0, 3600]"},
      {"--timeout 3601", "--timeout must be in (0, 3600]"},
      {"--memory-mb 17592186044416", "--memory-mb must be in [64, 65536]"},  // << 20 overflows int64
      {"--memory-mb 63", "--memory-mb must be in [64, 65536]"},
      {"--workers 0", "--workers must be in [1, 1024]"},
      {"--workers 100000", "--workers must be in [1, 1024]"},
      {"--samples-per-task 0", "--samples-per-task must be in [1, 100000]"},
      {"--batch-tasks 0", "--batch-tasks must be in [1, 65536]"},
      {"--limit -1", "--limit must be in [0, 1000000000]"},
      {"--max-new-tokens 0", "--max-new-tokens must be in [1, 1048576]"},
      {"--steps -2", "--steps must be in [0, 1048576]"},
  };
  for (const auto& [flags, message] : cases) {
    auto r = testing::run_binary(base + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << flags << ": " << r.err;
  }
  // The edges are accepted (they fail later for another reason, or not at all).
  auto edge = testing::run_binary(base + "--timeout 3600 --memory-mb 65536 --workers 1024 --limit 0 --force");
  EXPECT_NE(edge.exit_code, 2) << edge.err;
}

TEST(EvalInputs, GzipBombNamesTheFileAndTheLimit) {
  const test::TempDir dir("eval_inputs");
  const std::string path = dir.file("bomb.jsonl.gz");
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  const std::string spaces(1 << 16, ' ');
  for (int i = 0; i < 64; ++i) ASSERT_EQ(gzwrite(f, spaces.data(), static_cast<unsigned>(spaces.size())), 1 << 16);  // 4 MiB, one line
  gzclose(f);
  auto r = load_tasks(path, 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ": more than 1048576 bytes once decompressed"), std::string::npos)
      << r.status().message();
  // Under the limit the same content is an empty benchmark, as before.
  auto small = load_tasks(path, 8 << 20);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("holds no tasks"), std::string::npos) << small.status().message();
}

TEST(EvalInputs, InvalidUtf8AndBadEntryPointsNameTheLine) {
  const test::TempDir dir("eval_inputs");
  write(dir.file("u.jsonl"), kTask + "\n" + R"({"task_id": "x/1", "prompt": ")" "\xff" R"(", "entry_point": "f", "test": "t"})" "\n");
  auto r = load_tasks(dir.file("u.jsonl"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 2: not valid UTF-8 (byte 31 of the line)"), std::string::npos)
      << r.status().message();
  write(dir.file("e.jsonl"), R"({"task_id": "x/0", "prompt": "p", "entry_point": "f); import os", "test": "t"})");
  auto e = load_tasks(dir.file("e.jsonl"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("line 1: entry_point \"f); import os\" is not a Python identifier"), std::string::npos)
      << e.status().message();
}

TEST(EvalInputs, ResumeRefusesRecordsOutsideTheRun) {
  const test::TempDir dir("eval_inputs");
  const nlohmann::json settings = {{"tasks", 1}};
  const std::string head = R"({"settings": {"tasks": 1}})" "\n";
  const auto rec = [](const std::string& id, int64_t sample) {
    return nlohmann::json{{"task_id", id}, {"sample", sample}, {"passed", true}, {"failure", "none"}}.dump() + "\n";
  };
  const std::map<std::string, int> run = {{"x/0", 2}};
  // The probe's file: 1 task x 2 samples, and records the run never checks.
  write(dir.file("a.jsonl"), head + rec("x/0", 0) + rec("x/0", 1) + rec("x/0", 5));
  auto a = ResultsFile::open(dir.file("a.jsonl"), settings, true, false, run);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("line 4: sample 5 of x/0 is out of range (this run checks 2 per task)"),
            std::string::npos) << a.status().message();
  write(dir.file("b.jsonl"), head + rec("x/0", 0) + rec("y/9", 0));
  auto b = ResultsFile::open(dir.file("b.jsonl"), settings, true, false, run);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("line 3: task_id y/9 is not a task of this run"), std::string::npos)
      << b.status().message();
  write(dir.file("c.jsonl"), head + rec("x/0", -1));
  auto c = ResultsFile::open(dir.file("c.jsonl"), settings, true, false, run);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("line 2"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("sample must be an integer in [0, 2147483647]"), std::string::npos)
      << c.status().message();
  // A file within the run resumes with its records.
  write(dir.file("d.jsonl"), head + rec("x/0", 1));
  auto d = ResultsFile::open(dir.file("d.jsonl"), settings, true, false, run);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->records().size(), 1u);
  EXPECT_TRUE(d->done("x/0", 1));
  EXPECT_FALSE(d->done("x/0", 0));
}

// The same through `diffucoder eval --resume`, and --completions with invalid UTF-8.
TEST(EvalInputs, CliResumeAndCompletionsErrors) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("eval_inputs");
  write(dir.file("c.jsonl"), R"({"task_id": "HumanEval/2", "completion": "    return number % 1.0\n"})" "\n"
                             R"({"task_id": "HumanEval/2", "completion": "    return 0.0\n"})" "\n");
  const std::string common = "eval --benchmark " + kHumanEval + " --completions " + dir.file("c.jsonl") +
                             " --out " + dir.file("r.jsonl") + " --limit 3 --quiet --json";
  auto first = testing::run_binary(common);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)["samples"], 2);
  {
    std::ofstream out(dir.file("r.jsonl"), std::ios::app);
    for (int s = 2; s < 7; ++s)
      out << nlohmann::json{{"task_id", "HumanEval/2"}, {"sample", s}, {"passed", true}, {"failure", "none"}}.dump() << "\n";
  }
  auto resumed = testing::run_binary(common + " --resume");
  EXPECT_EQ(resumed.exit_code, 1) << resumed.out;
  EXPECT_NE(resumed.err.find("line 4: sample 2 of HumanEval/2 is out of range"), std::string::npos) << resumed.err;
  write(dir.file("bad.jsonl"), R"({"task_id": "HumanEval/2", "completion": "    return 0.5 # )" "\xc3\x28" R"("})" "\n");
  auto bad = testing::run_binary("eval --benchmark " + kHumanEval + " --completions " + dir.file("bad.jsonl") +
                                 " --out " + dir.file("b.jsonl") + " --quiet");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("line 1: not valid UTF-8"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace dc::eval::inputs
