// eval: pass@k against hand-computed values, task loading, prompts and code extraction, and
// `diffucoder eval` end to end — all 164 canonical HumanEval solutions pass, deliberately broken
// ones fail with the right kind, a killed run resumes to the same totals, and the model mode runs on
// the tiny checkpoint (pass rate 0, the honest number for a random model).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "eval/humaneval.h"
#include "eval/pass_at_k.h"
#include "eval/run.h"
#include "fixtures.h"
#include "kill_run.h"
#include "process.h"
#include "temp_dir.h"

namespace dc::eval {
namespace {

const std::string kHumanEval = std::string(DC_SOURCE_DIR) + "/data/humaneval/HumanEval.jsonl.gz";

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);  // a line being written may be partial
  }
  return out;
}

bool sandbox_here() { return sandbox::check_available().ok(); }

TEST(PassAtK, HandComputedValues) {
  EXPECT_DOUBLE_EQ(pass_at_k(1, 1, 1), 1.0);
  EXPECT_DOUBLE_EQ(pass_at_k(1, 0, 1), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(10, 0, 5), 0.0);
  EXPECT_NEAR(pass_at_k(10, 1, 1), 0.1, 1e-15);
  EXPECT_NEAR(pass_at_k(10, 3, 1), 0.3, 1e-15);
  EXPECT_NEAR(pass_at_k(5, 2, 2), 0.7, 1e-15);                   // 1 − C(3,2)/C(5,2) = 1 − 3/10
  EXPECT_NEAR(pass_at_k(10, 3, 5), 1.0 - 21.0 / 252.0, 1e-15);  // 1 − C(7,5)/C(10,5)
  EXPECT_NEAR(pass_at_k(20, 1, 10), 0.5, 1e-15);                 // one passing sample in half the subsets
  EXPECT_NEAR(pass_at_k(200, 10, 100), 0.9992289739372822, 1e-12);  // exact fractions (Python)
  EXPECT_DOUBLE_EQ(pass_at_k(10, 6, 5), 1.0);                    // n − c < k
}

TEST(Summary, PassAtKOverTasks) {
  std::vector<Task> tasks(2);
  tasks[0].task_id = "a";
  tasks[1].task_id = "b";
  std::vector<SampleRecord> recs;
  for (int s = 0; s < 10; ++s) {
    SampleRecord a, b;
    a.task_id = "a", b.task_id = "b";
    a.sample = b.sample = s;
    a.passed = s < 3;
    a.failure = s < 3 ? Failure::kNone : Failure::kAssertion;
    b.failure = s % 2 ? Failure::kTimeout : Failure::kSyntax;
    recs.push_back(a);
    recs.push_back(b);
  }
  Summary s = summarize(tasks, recs);
  EXPECT_EQ(s.tasks, 2);
  EXPECT_EQ(s.min_samples, 10);
  EXPECT_NEAR(s.base.pass_at_k.at(1), (0.3 + 0.0) / 2, 1e-12);
  EXPECT_NEAR(s.base.pass_at_k.at(10), 0.5, 1e-12);
  EXPECT_EQ(s.base.pass_at_k.count(100), 0u);
  EXPECT_EQ(s.base.failures.at("assertion"), 7);
  EXPECT_EQ(s.base.failures.at("timeout"), 5);
  EXPECT_EQ(s.base.failures.at("syntax"), 5);
  EXPECT_FALSE(s.has_plus);
}

TEST(Tasks, LoadsHumanEvalGzipAndPlain) {
  auto tasks = load_tasks(kHumanEval);
  ASSERT_TRUE(tasks.ok()) << tasks.status().message();
  ASSERT_EQ(tasks->size(), 164u);
  EXPECT_EQ((*tasks)[0].task_id, "HumanEval/0");
  EXPECT_EQ((*tasks)[0].entry_point, "has_close_elements");
  EXPECT_FALSE((*tasks)[163].canonical_solution.empty());
  const test::TempDir dir("eval");
  write(dir.file("t.jsonl"), R"({"task_id": "x/0", "prompt": "def f():\n", "entry_point": "f", "test": "def check(c): pass"})"
                         "\n\n");
  auto plain = load_tasks(dir.file("t.jsonl"));
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->size(), 1u);
  write(dir.file("bad.jsonl"), R"({"task_id": "x/0", "prompt": "p", "test": "t"})");
  auto bad = load_tasks(dir.file("bad.jsonl"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 1: needs a string \"entry_point\""), std::string::npos);
  write(dir.file("dup.jsonl"), R"({"task_id": "x", "prompt": "p", "entry_point": "f", "test": "t"})"
                           "\n" R"({"task_id": "x", "prompt": "p", "entry_point": "f", "test": "t"})");
  EXPECT_NE(load_tasks(dir.file("dup.jsonl")).status().message().find("duplicate task_id x"), std::string::npos);
  EXPECT_FALSE(load_tasks(dir.file("missing.jsonl")).ok());
}

TEST(Prompts, BaseAndInstructFormats) {
  Task t;
  t.task_id = "HumanEval/0";
  t.prompt = "def add(a, b):\n    \"\"\"Add.\"\"\"\n";
  t.entry_point = "add";
  t.test = "def check(c): assert c(1, 2) == 3";
  EXPECT_EQ(model_prompt(t, PromptFormat::kBase), t.prompt);
  EXPECT_EQ(model_prompt(t, PromptFormat::kInstruct),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "Please provide a self-contained Python script that solves the following problem in a markdown code "
            "block:\n```\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n```\n<|im_end|>\n<|im_start|>assistant\n"
            "Below is a Python script with a self-contained function that solves the problem and passes "
            "corresponding tests:\n```python\n");
  // Base: the completion continues the prompt, cut at EvalPlus' stop strings.
  EXPECT_EQ(program_from_generation(t, "    return a + b\n\n\ndef main():\n    pass\n", PromptFormat::kBase),
            t.prompt + "    return a + b\n\n");
  EXPECT_EQ(program_from_generation(t, "    return a + b\nprint(add(1, 2))", PromptFormat::kBase),
            t.prompt + "    return a + b");
  // Instruct: a whole script up to the closing fence.
  EXPECT_EQ(program_from_generation(t, "def add(a, b):\n    return a + b\n```\nExplanation...", PromptFormat::kInstruct),
            "def add(a, b):\n    return a + b\n");
  EXPECT_EQ(program_from_generation(t, "def add(a, b): return a + b", PromptFormat::kInstruct),
            "def add(a, b): return a + b");
}

// ---- the binary ---------------------------------------------------------------------------------

TEST(EvalCli, AllCanonicalSolutionsPass) {
  if (!sandbox_here()) GTEST_SKIP() << "no namespaces";
  auto tasks = load_tasks(kHumanEval);
  ASSERT_TRUE(tasks.ok());
  const test::TempDir dir("eval");
  std::ofstream c(dir.file("canonical.jsonl"));
  for (const auto& t : *tasks) c << nlohmann::json{{"task_id", t.task_id}, {"completion", t.canonical_solution}}.dump() << "\n";
  c.close();
  auto r = testing::run_binary("eval --benchmark " + kHumanEval + " --completions " + dir.file("canonical.jsonl") +
                               " --out " + dir.file("results.jsonl") + " --workers 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tasks"], 164);
  EXPECT_EQ(j["passed"], 164) << r.out;
  EXPECT_DOUBLE_EQ(j["pass_at_k"]["pass@1"].get<double>(), 1.0);
  auto lines = read_jsonl(dir.file("results.jsonl"));
  ASSERT_EQ(lines.size(), 165u);
  EXPECT_EQ(lines[0]["settings"]["tasks"], 164);
  EXPECT_NE(r.err.find("164/164 samples"), std::string::npos) << r.err;
}

// Deliberately broken solutions of HumanEval/0 (has_close_elements) and /2 (truncate_number).
TEST(EvalCli, BrokenSolutionsFailWithTheRightKind) {
  if (!sandbox_here()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("eval");
  const std::vector<std::pair<std::string, std::string>> cases = {
      // off by one: compares with <= over indices shifted by one
      {"HumanEval/0", "    for i in range(len(numbers) - 1):\n        if abs(numbers[i] - numbers[i + 1]) < threshold:\n"
                      "            return True\n    return False\n"},
      {"HumanEval/2", "    return str(number % 1.0)\n"},                      // wrong return type: the test's == fails
      {"HumanEval/2", "    return number % '1'\n"},                          // wrong operand type: TypeError
      {"HumanEval/2", "    while True:\n        pass\n"},                    // infinite loop
      {"HumanEval/2", "    raise ValueError('nope')\n"},                      // exception
      {"HumanEval/2", "    return number % 1.0 +\n"},                         // syntax error
      {"HumanEval/2", "    x = bytearray(8 << 30)\n    return number % 1.0\n"},  // 8 GB: memory limit
      {"HumanEval/2", "    import sys; sys.exit(0)\n"},                       // exiting early is no pass
      {"HumanEval/2", "    print('\\nDC_PASS_forged')\n    import os; os._exit(0)\n"},  // cannot forge the nonce
      {"HumanEval/2", "    return number % 1.0\n"},                           // correct
  };
  std::ofstream c(dir.file("broken.jsonl"));
  for (const auto& [id, completion] : cases) c << nlohmann::json{{"task_id", id}, {"completion", completion}}.dump() << "\n";
  c.close();
  auto r = testing::run_binary("eval --benchmark " + kHumanEval + " --completions " + dir.file("broken.jsonl") +
                               " --out " + dir.file("results.jsonl") + " --timeout 2 --memory-mb 512 --quiet --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = read_jsonl(dir.file("results.jsonl"));
  ASSERT_EQ(lines.size(), cases.size() + 1);
  std::map<std::pair<std::string, int>, nlohmann::json> by;
  for (size_t i = 1; i < lines.size(); ++i) by[{lines[i]["task_id"], lines[i]["sample"].get<int>()}] = lines[i];
  const auto key = [](const char* id, int s) { return std::make_pair(std::string(id), s); };
  EXPECT_EQ(by[key("HumanEval/0", 0)]["failure"], "assertion") << by[key("HumanEval/0", 0)].dump();
  const std::vector<std::string> kinds = {"assertion", "exception", "timeout", "exception", "syntax", "limit", "exception", "exception", "none"};
  for (int s = 0; s < static_cast<int>(kinds.size()); ++s) {
    const auto& rec = by[key("HumanEval/2", s)];
    EXPECT_EQ(rec["failure"], kinds[s]) << "sample " << s << ": " << rec.dump();
    EXPECT_EQ(rec["passed"].get<bool>(), kinds[s] == "none") << rec.dump();
  }
  EXPECT_NE(by[key("HumanEval/2", 1)]["detail"].get<std::string>().find("TypeError"), std::string::npos);
  EXPECT_NE(by[key("HumanEval/2", 3)]["detail"].get<std::string>().find("ValueError: nope"), std::string::npos);
  EXPECT_NE(by[key("HumanEval/2", 6)]["detail"].get<std::string>().find("SystemExit"), std::string::npos);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["passed"], 1);
  EXPECT_EQ(j["failures"]["exception"], 4);
}

TEST(EvalCli, KilledRunResumesToTheSameTotals) {
  if (!sandbox_here()) GTEST_SKIP() << "no namespaces";
  auto tasks = load_tasks(kHumanEval);
  ASSERT_TRUE(tasks.ok());
  const test::TempDir dir("eval");
  // 20 tasks, every third solution broken, two samples each.
  std::ofstream c(dir.file("c.jsonl"));
  for (int i = 0; i < 20; ++i) {
    const auto& t = (*tasks)[static_cast<size_t>(i)];
    for (int s = 0; s < 2; ++s) {
      std::string completion = (i + s) % 3 == 0 ? "    return None\n" : t.canonical_solution;
      c << nlohmann::json{{"task_id", t.task_id}, {"completion", completion}}.dump() << "\n";
    }
  }
  c.close();
  const std::string common = "eval --benchmark " + kHumanEval + " --completions " + dir.file("c.jsonl") +
                             " --limit 20 --workers 1 --quiet --json";
  auto full = testing::run_binary(common + " --out " + dir.file("full.jsonl"));
  ASSERT_EQ(full.exit_code, 0) << full.err;

  // The same run, killed (SIGKILL, no chance to clean up) once it has written some samples.
  const std::string out = dir.file("killed.jsonl");
  // Its in-flight sandbox temp dirs cannot be removed by a killed process: keep them in `dir`.
  testing::run_and_kill({"eval", "--benchmark", kHumanEval, "--completions", dir.file("c.jsonl"), "--limit", "20",
                         "--workers", "1", "--quiet", "--json", "--out", out},
                        dir.file("tmp"), [&] { return read_jsonl(out).size() > 10; });
  const size_t written = read_jsonl(out).size();
  ASSERT_GT(written, 5u);
  ASSERT_LT(written, 41u) << "the run finished before it was killed";
  { std::ofstream(out, std::ios::app) << R"({"task_id": "HumanEval/3", "sam)"; }  // a half-written line
  auto resumed = testing::run_binary(common + " --out " + out + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto a = nlohmann::json::parse(full.out), b = nlohmann::json::parse(resumed.out);
  a.erase("results"), b.erase("results");
  EXPECT_EQ(a, b);
  EXPECT_EQ(read_jsonl(out).size(), 41u);
  // Other settings are refused, naming the key.
  auto other = testing::run_binary(common + " --out " + out + " --resume --timeout 5");
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("timeout_s"), std::string::npos) << other.err;
  // An existing file without --resume / --force is refused.
  auto again = testing::run_binary(common + " --out " + out);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
}

TEST(EvalCli, ModelModeOnTheTinyCheckpoint) {
  if (!sandbox_here()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("eval");
  const std::string model = testing::fixtures_dir() + "/tiny-vocab";
  for (const char* format : {"base", "instruct"}) {
    const std::string out = dir.file(std::string(format) + ".jsonl");
    auto r = testing::run_binary("eval --model " + model + " --benchmark " + kHumanEval + " --limit 3 --samples-per-task 2 "
                                 "--batch-tasks 2 --max-new-tokens 16 --temperature 0.5 --seed 1 --prompt-format " +
                                 format + " --out " + out + " --json --weight-cache off");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tasks"], 3);
    EXPECT_EQ(j["samples"], 6);
    EXPECT_DOUBLE_EQ(j["pass_at_k"]["pass@1"].get<double>(), 0.0);  // a random model
    EXPECT_EQ(j["pass_at_k"].count("pass@10"), 0u);
    auto lines = read_jsonl(out);
    ASSERT_EQ(lines.size(), 7u);
    EXPECT_EQ(lines[0]["settings"]["prompt_format"], format);
    EXPECT_EQ(lines[0]["settings"]["generation"]["max_new_tokens"], 16);
    EXPECT_GT(lines[1]["tokens"].get<int64_t>() + lines[2]["tokens"].get<int64_t>(), -1);
    EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
  }
  // --fast and a wrong flag combination.
  auto fast = testing::run_binary("eval --model " + model + " --benchmark " + kHumanEval +
                                  " --limit 1 --max-new-tokens 32 --fast --quiet --out " + dir.file("fast.jsonl") +
                                  " --weight-cache off");
  EXPECT_EQ(fast.exit_code, 0) << fast.err;
  auto both = testing::run_binary("eval --model " + model + " --completions x --benchmark " + kHumanEval);
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("exactly one of --model, --completions"), std::string::npos);
}

}  // namespace
}  // namespace dc::eval
