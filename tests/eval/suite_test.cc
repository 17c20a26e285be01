// `eval --suite paper` (issue 38): the paper's row, its JSON and the HTML report from known results; the suite
// through the binary with --completions (every file written, the numbers, MBPP+ from --mbpp-plus), a killed suite
// resumed to the same totals, the tiny checkpoint's suite, --batch-tasks giving the same samples as one task at a
// time at temperature 0 (overlapped checks or not), and bad flags refused naming them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "eval/humaneval.h"
#include "eval/report.h"
#include "eval/suite.h"
#include "fixtures.h"
#include "kill_run.h"
#include "process.h"
#include "results_lines.h"
#include "sandbox/sandbox.h"
#include "temp_dir.h"

namespace dc::eval::suite_test {
namespace {

const std::string kData = std::string(DC_SOURCE_DIR) + "/data";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

size_t count_lines(const std::string& path) {
  const std::string text = read(path);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// What is wrong with `html` as a self-contained HTML page ("" when nothing): the doctype, every element closed in
// order (void elements aside), attribute values quoted, no '<' or '>' left unescaped in text or attributes, and
// nothing fetched (no src=, href=, url( or @import).
std::string html_problem(const std::string& html) {
  if (html.rfind("<!DOCTYPE html>\n<html", 0) != 0) return "no doctype";
  for (const char* fetch : {"src=", "href=", "url(", "@import"})
    if (html.find(fetch) != std::string::npos) return std::string("fetches something: ") + fetch;
  static const std::set<std::string> kVoid = {"meta", "br", "hr", "img", "input", "link"};
  static const std::regex kAttr(R"(\s+[a-z-]+="[^"<>]*")");
  std::vector<std::string> open;
  size_t i = html.find('>') + 1;  // after the doctype
  while (i < html.size()) {
    const size_t lt = html.find('<', i);
    const std::string text = html.substr(i, (lt == std::string::npos ? html.size() : lt) - i);
    if (text.find('>') != std::string::npos) return "unescaped '>' in text: " + text.substr(0, 80);
    if (lt == std::string::npos) break;
    const size_t gt = html.find('>', lt);
    if (gt == std::string::npos) return "unclosed tag at " + std::to_string(lt);
    const std::string tag = html.substr(lt + 1, gt - lt - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag: " + tag.substr(0, 80);
    i = gt + 1;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "</" + tag.substr(1) + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n"));
    const std::string attrs = tag.substr(name.size());
    if (!std::regex_replace(attrs, kAttr, "").empty()) return "bad attributes in <" + tag.substr(0, 80) + ">";
    if (!kVoid.count(name)) open.push_back(name);
    if (name == "style") {  // raw text up to </style>
      const size_t end = html.find("</style>", i);
      if (end == std::string::npos) return "unclosed style";
      i = end;
    }
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return "";
}

std::string unescape(std::string s) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#39;", "'"}, {"&amp;", "&"}}) {
    for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  }
  return s;
}

// Every cell's title in the report, unescaped, in order.
std::vector<std::string> cell_titles(const std::string& html) {
  std::vector<std::string> out;
  static const std::regex kTitle("class=\"c [a-z]+\" title=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), kTitle); it != std::sregex_iterator(); ++it)
    out.push_back(unescape((*it)[1].str()));
  return out;
}

SampleRecord record(const std::string& id, bool base, bool plus, Failure f = Failure::kAssertion) {
  SampleRecord r;
  r.task_id = id;
  r.passed = base;
  r.failure = base ? Failure::kNone : f;
  r.has_plus = true;
  r.passed_plus = plus;
  r.failure_plus = plus ? Failure::kNone : base ? Failure::kTimeout : f;
  return r;
}

TEST(SuiteReport, PaperRowJsonAndHtmlFromKnownResults) {
  std::vector<SuiteResult> results;
  const auto& cols = paper_columns();
  ASSERT_EQ(cols.size(), 4u);
  std::vector<Task> tasks(4);
  const std::vector<std::string> ids = {"X/0", "X/1", "X/<b>&'2", "X/3"};  // a hostile id: escaped everywhere
  for (size_t i = 0; i < 4; ++i) tasks[i].task_id = ids[i];
  for (size_t c = 0; c < 3; ++c) {
    SuiteResult r;
    r.column = cols[c];
    r.ran = true;
    r.results_path = "dir/" + std::string(cols[c].file_stem) + ".jsonl";
    r.task_ids = ids;
    // base passes 3 of 4 tasks, plus 1 of 4 (one timeout, two assertion failures); task 3 has no sample.
    r.records = {record(ids[0], true, true), record(ids[1], true, false), record(ids[2], false, false)};
    if (c == 2) r.records = {record(ids[0], true, false), record(ids[1], false, false), record(ids[2], false, false)};
    r.summary = summarize(tasks, r.records);
    r.columns = true;
    results.push_back(r);
  }
  SuiteResult mbpp_plus;
  mbpp_plus.column = cols[3];
  mbpp_plus.not_run = "not shipped";
  results.push_back(mbpp_plus);

  // HumanEval = base of its run 2/3 (one task without samples is missing, not failed), HumanEval+ = plus 1/3,
  // MBPP = base 1/3; mean over the three present.
  ASSERT_TRUE(suite_pass_at_1(results[0]).has_value());
  EXPECT_NEAR(*suite_pass_at_1(results[0]), 2.0 / 3, 1e-12);
  EXPECT_NEAR(*suite_pass_at_1(results[1]), 1.0 / 3, 1e-12);
  EXPECT_NEAR(*suite_pass_at_1(results[2]), 1.0 / 3, 1e-12);
  EXPECT_FALSE(suite_pass_at_1(results[3]).has_value());
  EXPECT_NEAR(*suite_mean(results), (2.0 / 3 + 1.0 / 3 + 1.0 / 3) / 3, 1e-12);

  const std::string table = suite_table(results, "m");
  EXPECT_NE(table.find("| pass@1 (%) | HumanEval | HumanEval+ | MBPP | MBPP+ | mean (3 columns) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| m | 66.7 | 33.3 | 33.3 | n/a | 44.4 |"), std::string::npos) << table;
  EXPECT_NE(table.find("MBPP+: not run: not shipped"), std::string::npos) << table;

  const nlohmann::json j = suite_json(results, {{"model", "m"}});
  EXPECT_EQ(j["model"], "m");
  EXPECT_NEAR(j["row"]["HumanEval+"].get<double>(), 1.0 / 3, 1e-12);
  EXPECT_TRUE(j["row"]["MBPP+"].is_null());
  EXPECT_EQ(j["columns_in_mean"], nlohmann::json({"HumanEval", "HumanEval+", "MBPP"}));
  EXPECT_EQ(j["not_run"]["MBPP+"], "not shipped");
  EXPECT_EQ(j["benchmarks"]["humaneval+"]["plus"]["failures"]["timeout"], 1);
  EXPECT_EQ(j["benchmarks"]["humaneval+"]["missing_tasks"], 1);

  const std::string html = suite_report_html(results, "report <of> m", {{"model", "m"}});
  EXPECT_EQ(html_problem(html), "");
  EXPECT_EQ(html.find("<b>"), std::string::npos);  // the hostile id is text, not markup
  const std::vector<std::string> titles = cell_titles(html);
  ASSERT_EQ(titles.size(), 3u * 4 * 2);  // three benchmarks, four tasks, base and plus
  const auto has = [&](const std::string& t) { return std::count(titles.begin(), titles.end(), t); };
  EXPECT_EQ(has("X/<b>&'2 base: 0/1 passed, assertion 1"), 3) << ::testing::PrintToString(titles);
  EXPECT_EQ(has("X/1 plus: 0/1 passed, timeout 1"), 2);  // HumanEval's and HumanEval+'s; MBPP's failed base
  EXPECT_EQ(has("X/1 plus: 0/1 passed, assertion 1"), 1);
  EXPECT_EQ(has("X/3 base: 0/0 passed"), 3);  // a task without samples still has its cell
  EXPECT_EQ(titles[0], "X/0 base: 1/1 passed");
  EXPECT_NE(html.find("<td>44.4</td>"), std::string::npos);
}

// ---- the binary, in the sandbox -----------------------------------------------------------------

// A --completions file: the first four HumanEval tasks (HumanEval/1's broken) and MBPP tasks 11-14 (12's broken).
void write_completions(const std::string& path) {
  std::ofstream out(path);
  auto he = load_tasks(kData + "/humaneval/HumanEval.jsonl.gz");
  auto mbpp = load_tasks(kData + "/mbpp/mbpp.jsonl");
  ASSERT_TRUE(he.ok() && mbpp.ok());
  for (size_t i = 0; i < 4; ++i) {
    const Task& t = (*he)[i];
    out << nlohmann::json{{"task_id", t.task_id}, {"completion", i == 1 ? "    return []\n" : t.canonical_solution}}.dump() << "\n";
    const Task& m = (*mbpp)[i];
    out << nlohmann::json{{"task_id", m.task_id}, {"solution", i == 1 ? "def f(): pass\n" : m.canonical_solution}}.dump() << "\n";
  }
}

// The report's checks: valid, self-contained, a cell for every task of every benchmark that ran.
void expect_report(const std::string& path, const nlohmann::json& summary) {
  const std::string html = read(path);
  EXPECT_EQ(html_problem(html), "");
  std::set<std::string> ids_in_cells;
  for (const auto& title : cell_titles(html)) ids_in_cells.insert(title.substr(0, title.find(' ')));
  for (const auto& [name, b] : summary["benchmarks"].items()) {
    std::ifstream in(b["results"].get<std::string>());
    std::string line;
    std::getline(in, line);  // settings
    while (std::getline(in, line))
      EXPECT_TRUE(ids_in_cells.count(nlohmann::json::parse(line)["task_id"].get<std::string>())) << name << ": " << line;
  }
}

TEST(EvalSuiteCli, CompletionsWriteEveryFileAndThePaperRow) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("suite");
  write_completions(dir.file("c.jsonl"));
  // MBPP+ is not shipped: a HumanEval+ subset in EvalPlus' format stands in for its file (the plumbing of a
  // given --mbpp-plus; the completions' HumanEval ids are its tasks too).
  {
    std::ofstream sub(dir.file("plus.jsonl"));
    auto hp = load_tasks(kData + "/humanevalplus/HumanEvalPlus.jsonl.gz");
    ASSERT_TRUE(hp.ok());
    for (size_t i = 0; i < 4; ++i) sub << (*hp)[i].source << "\n";
  }
  const std::string out = dir.file("out");
  const std::string common = "eval --suite paper --completions " + dir.file("c.jsonl") + " --limit 4 --cache-dir " +
                             dir.file("cache") + " --workers 2 --quiet";
  auto r = testing::run_binary(common + " --out-dir " + out + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"humaneval.jsonl", "humanevalplus.jsonl", "mbpp.jsonl", "summary.json", "report.html"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  EXPECT_FALSE(std::filesystem::exists(out + "/mbppplus.jsonl"));
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j, nlohmann::json::parse(read(out + "/summary.json")));
  EXPECT_DOUBLE_EQ(j["row"]["HumanEval"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["row"]["HumanEval+"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["row"]["MBPP"].get<double>(), 0.75);
  EXPECT_TRUE(j["row"]["MBPP+"].is_null());
  EXPECT_NE(j["not_run"]["MBPP+"].get<std::string>().find("--mbpp-plus FILE"), std::string::npos);
  EXPECT_DOUBLE_EQ(j["row"]["mean"].get<double>(), 0.75);
  for (const char* b : {"humaneval", "humaneval+", "mbpp"}) {
    EXPECT_EQ(j["benchmarks"][b]["tasks"], 4) << b;
    EXPECT_EQ(j["benchmarks"][b]["samples"], 4) << b;
    EXPECT_EQ(count_lines(j["benchmarks"][b]["results"].get<std::string>()), 5u) << b;
  }
  expect_report(out + "/report.html", j);

  // The table, and MBPP+ from --mbpp-plus: the fourth column and a mean over four.
  auto plus = testing::run_binary(common + " --out-dir " + dir.file("out4") + " --mbpp-plus " + dir.file("plus.jsonl"));
  ASSERT_EQ(plus.exit_code, 0) << plus.err;
  EXPECT_NE(plus.out.find("| pass@1 (%) | HumanEval | HumanEval+ | MBPP | MBPP+ | mean |"), std::string::npos) << plus.out;
  EXPECT_NE(plus.out.find("| 75.0 | 75.0 | 75.0 | 75.0 | 75.0 |"), std::string::npos) << plus.out;
  EXPECT_NE(plus.out.find("--limit 4: the first 4 tasks"), std::string::npos) << plus.out;
  EXPECT_EQ(count_lines(dir.file("out4/mbppplus.jsonl")), 5u);

  // An existing output without --resume / --force is refused, naming the file.
  auto again = testing::run_binary(common + " --out-dir " + out);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("humaneval.jsonl exists: pass --resume"), std::string::npos) << again.err;
}

TEST(EvalSuiteCli, KilledSuiteResumesToTheSameTotals) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("suite");
  write_completions(dir.file("c.jsonl"));
  const std::string cache = dir.file("cache");
  const std::vector<std::string> args = {"eval", "--suite", "paper", "--completions", dir.file("c.jsonl"), "--limit", "4",
                                         "--quiet", "--json", "--cache-dir", cache,
                                         "--timeout", "20"};  // (HumanEval's 3 s can pass under a loaded machine)
  std::string common;
  for (const auto& a : args) common += a + " ";
  auto full = testing::run_binary(common + "--out-dir " + dir.file("full"));  // also fills the expected-output cache
  ASSERT_EQ(full.exit_code, 0) << full.err;

  // The same suite (one worker, so it is caught midway; --workers is not a setting), SIGKILLed once HumanEval+'s
  // results file has a sample (HumanEval's is done by then).
  const std::string out = dir.file("killed");
  std::vector<std::string> killed = args;
  killed.insert(killed.end(), {"--workers", "1", "--out-dir", out});
  testing::run_and_kill(killed, dir.file("tmp"), [&] { return count_lines(out + "/humanevalplus.jsonl") >= 2; });
  ASSERT_GE(count_lines(out + "/humanevalplus.jsonl"), 2u);
  ASSERT_FALSE(std::filesystem::exists(out + "/summary.json")) << "the suite finished before it was killed";
  { std::ofstream(out + "/humanevalplus.jsonl", std::ios::app) << R"({"task_id": "HumanEval/3", "sam)"; }

  auto resumed = testing::run_binary(common + "--out-dir " + out + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto a = nlohmann::json::parse(full.out), b = nlohmann::json::parse(resumed.out);
  EXPECT_EQ(a["row"], b["row"]);
  for (const char* name : {"humaneval", "humaneval+", "mbpp"}) {
    a["benchmarks"][name].erase("results"), b["benchmarks"][name].erase("results");
    EXPECT_EQ(a["benchmarks"][name], b["benchmarks"][name]) << name;
  }
  for (const char* f : {"humaneval.jsonl", "humanevalplus.jsonl", "mbpp.jsonl"}) EXPECT_EQ(count_lines(out + "/" + f), 5u) << f;
  expect_report(out + "/report.html", nlohmann::json::parse(read(out + "/summary.json")));
}

TEST(EvalSuiteCli, TinyCheckpointSuiteWritesEveryFile) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("suite");
  const std::string out = dir.file("out");
  auto r = testing::run_binary("eval --suite paper --model " + testing::vocab_model() + " --limit 2 --batch-tasks 1 "
                               "--overlap-checks on "
                               "--max-new-tokens 8 --out-dir " + out + " --cache-dir " + dir.file("cache") +
                               " --weight-cache off --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* b : {"humaneval", "humaneval+", "mbpp"}) {
    EXPECT_EQ(j["benchmarks"][b]["tasks"], 2) << b;
    EXPECT_EQ(count_lines(out + "/" + (std::string(b) == "humaneval+" ? "humanevalplus" : b) + ".jsonl"), 3u) << b;
  }
  EXPECT_DOUBLE_EQ(j["row"]["mean"].get<double>(), 0.0);  // a random model
  EXPECT_EQ(j["model"], testing::vocab_model());
  EXPECT_NE(r.err.find("eval humaneval+: "), std::string::npos) << r.err;  // the progress line names the benchmark
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;
  expect_report(out + "/report.html", j);
}

// The sample lines of a results file by (task_id, sample), without their wall time.
std::map<std::pair<std::string, int>, nlohmann::json> sample_lines(const std::string& path) {
  auto out = testing::results_lines(path);
  for (auto& [key, j] : out) j.erase("wall_ms");
  return out;
}

// HumanEval and HumanEval+ share their prompts: the suite decodes each once and checks the completion under both,
// and its results equal those of the two benchmarks run separately on the same completions; a resumed suite takes
// the completions of HumanEval+'s missing samples from HumanEval's results file.
TEST(EvalSuiteCli, HumanEvalPromptsAreDecodedOnceForBothBenchmarks) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("suite");
  const std::string out = dir.file("out"), cache = " --cache-dir " + dir.file("cache");
  const std::string suite = "eval --suite paper --model " + testing::vocab_model() + " --limit 2 --samples-per-task 2 "
                            "--temperature 0.8 --max-new-tokens 8 --prompt-format base --out-dir " + out + cache + " --weight-cache off --quiet --json";
  auto r = testing::run_binary(suite);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["benchmarks"]["humaneval"]["generated"], 4) << r.out;  // 2 prompts, 2 samples each
  EXPECT_EQ(j["benchmarks"]["humaneval"]["reused"], 0);
  EXPECT_EQ(j["benchmarks"]["humaneval+"]["generated"], 0) << r.out;
  EXPECT_EQ(j["benchmarks"]["humaneval+"]["reused"], 4);
  EXPECT_EQ(j["benchmarks"]["humaneval+"]["reused_from"], "HumanEval");
  EXPECT_EQ(j["benchmarks"]["mbpp"]["generated"], 4);
  const auto he = sample_lines(out + "/humaneval.jsonl"), hp = sample_lines(out + "/humanevalplus.jsonl");
  ASSERT_EQ(he.size(), 4u);
  ASSERT_EQ(hp.size(), 4u);
  std::set<std::string> distinct;
  for (const auto& [key, rec] : he) {
    EXPECT_EQ(hp.at(key)["completion"], rec["completion"]) << key.first;
    EXPECT_EQ(hp.at(key)["tokens"], rec["tokens"]) << key.first;
    distinct.insert(rec["completion"].get<std::string>());
  }
  EXPECT_GT(distinct.size(), 2u);  // the samples differ: the comparison can fail

  // The two benchmarks run separately on those completions (each benchmark's program: its prompt + the completion
  // cut at the stop strings, as the suite made it) give the suite's records and row.
  const std::map<std::string, std::string> names = {{"humaneval", "HumanEval"}, {"humaneval+", "HumanEval+"}};
  for (const auto& [bench, column] : names) {
    auto tasks = load_tasks(kData + (bench == "humaneval" ? "/humaneval/HumanEval.jsonl.gz" : "/humanevalplus/HumanEvalPlus.jsonl.gz"));
    ASSERT_TRUE(tasks.ok());
    const std::string given = dir.file(bench + "-given.jsonl");
    {
      std::ofstream g(given);
      for (const auto& [key, rec] : he) {
        const Task& task = (*tasks)[std::stoul(key.first.substr(key.first.find('/') + 1))];
        ASSERT_EQ(task.task_id, key.first);
        g << nlohmann::json{{"task_id", key.first},
                            {"solution", program_from_generation(task, rec["completion"], PromptFormat::kBase)}}.dump()
          << "\n";
      }
    }
    const std::string alone = dir.file(bench + "-alone.jsonl");
    auto separate = testing::run_binary("eval --benchmark " + bench + " --completions " + given + " --limit 2 --out " +
                                        alone + cache + " --quiet --json");
    ASSERT_EQ(separate.exit_code, 0) << separate.err;
    const auto suite_lines = sample_lines(out + "/" + (bench == "humaneval" ? "humaneval" : "humanevalplus") + ".jsonl");
    for (const auto& [key, rec] : sample_lines(alone))
      for (const char* k : {"passed", "failure", "detail", "passed_plus", "failure_plus", "detail_plus"})
        EXPECT_EQ(rec.value(k, nlohmann::json()), suite_lines.at(key).value(k, nlohmann::json())) << bench << " " << key.first << " " << k;
    auto s = nlohmann::json::parse(separate.out);
    const nlohmann::json& pass = bench == "humaneval" ? s["pass_at_k"] : s["plus"]["pass_at_k"];
    EXPECT_EQ(j["row"][column], pass["pass@1"]) << bench;
  }

  // Killed after HumanEval+'s first sample: resumed, the rest of its samples come from HumanEval's results file.
  {
    std::ifstream in(out + "/humanevalplus.jsonl");
    std::string settings, first;
    std::getline(in, settings), std::getline(in, first);
    in.close();
    std::ofstream(out + "/humanevalplus.jsonl") << settings << "\n" << first << "\n";
  }
  auto resumed = testing::run_binary(suite + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto k = nlohmann::json::parse(resumed.out);
  EXPECT_EQ(k["benchmarks"]["humaneval"]["generated"], 0);
  EXPECT_EQ(k["benchmarks"]["humaneval+"]["generated"], 0);
  EXPECT_EQ(k["benchmarks"]["humaneval+"]["reused"], 3);
  EXPECT_EQ(sample_lines(out + "/humanevalplus.jsonl"), hp);
  EXPECT_EQ(k["row"], j["row"]);
}

// --batch-tasks decodes several tasks' prompts (of different lengths: left-padded) in one generation; at
// temperature 0 each task gets the samples it gets alone. And checks overlapping the next batch's decoding give
// the records of checks run after each batch (--overlap-checks off).
TEST(EvalSuiteCli, BatchedTasksGiveTheSamplesOfOneTaskAtATime) {
  if (!sandbox::check_available().ok()) GTEST_SKIP() << "no namespaces";
  const test::TempDir dir("suite");
  const std::vector<std::string> runs = {"--batch-tasks 1 --overlap-checks on", "--batch-tasks 4 --overlap-checks on",
                                         "--batch-tasks 2 --overlap-checks off"};
  std::vector<std::map<std::pair<std::string, int>, nlohmann::json>> records(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::string out = dir.file("r" + std::to_string(i) + ".jsonl");
    auto r = testing::run_binary("eval --model " + testing::vocab_model() + " --benchmark mbpp --limit 4 " + runs[i] +
                                 " --max-new-tokens 24 --steps 12 --alg entropy --temperature 0 --out " + out +
                                 " --weight-cache off --quiet");
    ASSERT_EQ(r.exit_code, 0) << runs[i] << ": " << r.err;
    std::ifstream in(out);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      j.erase("wall_ms");
      records[i][{j["task_id"], j["sample"]}] = j;
    }
  }
  ASSERT_EQ(records[0].size(), 4u);
  EXPECT_EQ(records[0], records[1]);
  EXPECT_EQ(records[0], records[2]);
  std::set<std::string> distinct;
  for (const auto& [k, v] : records[0]) distinct.insert(v["completion"].get<std::string>());
  EXPECT_EQ(distinct.size(), 4u);  // the tasks' samples differ: the comparison can fail
}

TEST(EvalSuiteCli, BadFlagsAreRefusedNamingThem) {
  const test::TempDir dir("suite");
  write_completions(dir.file("c.jsonl"));
  const std::string c = " --completions " + dir.file("c.jsonl") + " --quiet";
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {"eval --suite other" + c, 2, "--suite must be paper, not other"},
      {"eval --suite paper --benchmark humaneval" + c, 2, "--suite and --benchmark: give one"},
      {"eval --suite paper --out x.jsonl" + c, 2, "--out is one benchmark's results file; --suite writes them into --out-dir"},
      {"eval --benchmark humaneval --out-dir eval-paper" + c, 2, "--out-dir is a flag of --suite paper"},
      {"eval --benchmark humaneval --mbpp-plus f.jsonl" + c, 2, "--mbpp-plus is a flag of --suite paper"},
      {"eval" + c, 2, "give --benchmark NAME|FILE, or --suite paper"},
      {"eval --suite paper --out-dir ''" + c, 2, "--out-dir must not be empty"},
      {"eval --benchmark humaneval --overlap-checks maybe" + c, 2, "--overlap-checks"},
      {"eval --suite paper --limit 1 --mbpp-plus " + dir.file("none.jsonl") + " --out-dir " + dir.file("o1") + c, 1,
       "--mbpp-plus: cannot"},
      {"eval --suite paper --limit 1 --mbpp-plus " + kData + "/humaneval/HumanEval.jsonl.gz --out-dir " + dir.file("o2") + c,
       1, "HumanEval.jsonl.gz: not in EvalPlus' format"},
  };
  for (const auto& [args, code, message] : cases) {
    auto r = testing::run_binary(args);
    EXPECT_EQ(r.exit_code, code) << args << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
  if (!sandbox::check_available().ok()) return;
  // A completion of a task none of the suite's benchmarks has, named.
  std::ofstream(dir.file("c.jsonl"), std::ios::app) << R"({"task_id": "Other/1", "completion": "x"})" "\n";
  auto foreign = testing::run_binary("eval --suite paper --limit 1 --out-dir " + dir.file("o3") + c + " --cache-dir " +
                                     dir.file("cache"));
  EXPECT_EQ(foreign.exit_code, 1);
  EXPECT_NE(foreign.err.find("task_id Other/1 is in none of the suite's benchmarks"), std::string::npos) << foreign.err;
}

}  // namespace
}  // namespace dc::eval::suite_test
