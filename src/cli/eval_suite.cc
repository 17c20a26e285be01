// `diffucoder eval --suite paper`: the benchmarks of DiffuCoder's table (HumanEval, HumanEval+, MBPP; MBPP+ from
// --mbpp-plus FILE, since it is not shipped) in one run with one model or one completions file: a resumable results
// file per benchmark in --out-dir, then the paper's row (eval/suite.h) printed and written as summary.json, and
// report.html (eval/report.h); both written atomically.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/common.h"
#include "cli/eval_run.h"
#include "eval/report.h"
#include "eval/suite.h"
#include "io/atomic_dir.h"

namespace dc::cli {
namespace {

// One benchmark of the suite before it runs.
struct SuiteEntry {
  eval::SuiteResult result;
  std::unique_ptr<EvalTasks> tasks;  // null: not run
  nlohmann::json settings;
  std::vector<eval::Sample> given;  // --completions' samples of its tasks
};

// Loads the suite's benchmarks (MBPP+ only from --mbpp-plus), each with its results path in --out-dir.
Result<std::vector<SuiteEntry>> load_suite(const EvalArgs& a) {
  std::vector<SuiteEntry> entries;
  for (const eval::SuiteColumn& col : eval::paper_columns()) {
    SuiteEntry e;
    e.result.column = col;
    std::string benchmark = col.benchmark;
    if (benchmark == "mbpp+") {
      if (a.mbpp_plus.empty()) {
        e.result.not_run = "EvalPlus' MBPP+ (378 sanitized tasks) is not shipped (data/mbpp/ holds the original MBPP; "
                           "data/mbpp/NOTE.md); give its file (MbppPlus.jsonl, EvalPlus' format) with --mbpp-plus FILE";
        entries.push_back(std::move(e));
        continue;
      }
      benchmark = a.mbpp_plus;
    }
    e.tasks = std::make_unique<EvalTasks>();
    Status s = load_benchmark(a, benchmark, *e.tasks, e.settings);
    if (!s.ok()) return s.with_context(col.column == std::string("MBPP+") ? "--mbpp-plus" : col.column);
    if (col.plus && (e.tasks->tasks.empty() || !e.tasks->tasks[0].has_inputs))
      return invalid_argument(std::string(col.column == std::string("MBPP+") ? "--mbpp-plus " : "") + e.tasks->path +
                              ": not in EvalPlus' format (no base_input / plus_input), so it has no plus column");
    e.result.results_path = a.out_dir + "/" + col.file_stem + ".jsonl";
    for (const auto& t : e.tasks->tasks) e.result.task_ids.push_back(t.task_id);
    entries.push_back(std::move(e));
  }
  return entries;
}

// --completions: each benchmark takes the lines of its tasks (HumanEval's ids are HumanEval+'s too); a line of a
// task no benchmark has is an error naming the task; a benchmark without any is not run, saying so.
Status split_completions(const EvalArgs& a, std::vector<SuiteEntry>& entries) {
  std::set<std::string> foreign_to_all;
  bool first = true;
  for (auto& e : entries) {
    if (!e.tasks) continue;
    std::set<std::string> foreign;
    DC_ASSIGN_OR_RETURN(e.given, read_completions(a.completions, *e.tasks, &foreign));
    if (first) foreign_to_all = foreign;
    else
      std::erase_if(foreign_to_all, [&](const std::string& id) { return !foreign.count(id); });
    first = false;
    if (e.given.empty()) {
      e.result.not_run = "--completions " + a.completions + " holds none of its tasks";
      e.tasks.reset();
    }
  }
  if (!foreign_to_all.empty())
    return invalid_argument("--completions " + a.completions + ": task_id " + *foreign_to_all.begin() +
                            " is in none of the suite's benchmarks");
  return Status::ok_status();
}

// Model mode: the samples earlier benchmarks of the suite decoded from a prompt a task of `t` has too (the same task
// id and model prompt: HumanEval's for HumanEval+, but HumanEval/115, whose prompts differ), read from their records
// (so a resumed suite reuses them too); `from` becomes the column they come from.
SharedSamples shared_samples(const std::vector<SuiteEntry>& entries, const std::vector<eval::SuiteResult>& done,
                             const EvalTasks& t, eval::PromptFormat format, std::string& from) {
  SharedSamples shared;
  for (size_t j = 0; j < done.size(); ++j) {
    if (!done[j].ran || !entries[j].tasks) continue;
    const EvalTasks& earlier = *entries[j].tasks;
    for (const eval::SampleRecord& r : done[j].records) {
      auto mine = t.by_id.find(r.task_id), theirs = earlier.by_id.find(r.task_id);
      if (mine == t.by_id.end() || theirs == earlier.by_id.end() || shared.count({r.task_id, r.sample}) ||
          eval::model_prompt(*mine->second, format) != eval::model_prompt(*theirs->second, format))
        continue;
      eval::Sample s;
      s.task_id = r.task_id, s.sample = r.sample, s.completion = r.completion, s.tokens = r.tokens;
      shared[{r.task_id, r.sample}] = std::move(s);
      from = done[j].column.column;
    }
  }
  return shared;
}

// The settings shown with the table: what ran and where its files are.
nlohmann::json about(const EvalArgs& a) {
  nlohmann::json j = {{"out_dir", a.out_dir},
                      {"summary", a.out_dir + "/summary.json"},
                      {"report", a.out_dir + "/report.html"},
                      {"limit", a.limit}};
  if (a.model_dir.empty()) j["completions"] = a.completions;
  else j["model"] = a.model_dir, j["samples_per_task"] = a.samples_per_task;
  return j;
}

Status write_text_atomically(const std::string& path, const std::string& text) {
  return write_file_atomically(path, [&](const ByteSink& sink) { return sink(text.data(), text.size()); });
}

Status run_suite_or_error(const EvalArgs& a, std::vector<eval::SuiteResult>& out) {
  DC_ASSIGN_OR_RETURN(std::vector<SuiteEntry> entries, load_suite(a));
  if (!a.completions.empty()) DC_RETURN_IF_ERROR(split_completions(a, entries));
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) return io_error("--out-dir " + a.out_dir + ": cannot create it: " + ec.message());
  DC_ASSIGN_OR_RETURN(EvalContext c, make_eval_context(a));
  int64_t total = 0;
  for (const auto& e : entries)
    if (e.tasks) total += c.model ? static_cast<int64_t>(e.tasks->tasks.size()) * a.samples_per_task
                                  : static_cast<int64_t>(e.given.size());
  eval::Progress progress(total, 0, a.quiet);
  for (auto& e : entries) {
    if (!e.tasks) {
      out.push_back(e.result);
      continue;
    }
    progress.set_label(e.result.column.benchmark);
    SharedSamples shared;
    GenerationCounts counts;
    if (c.model) shared = shared_samples(entries, out, *e.tasks, c.format, e.result.reused_from);
    auto records = run_benchmark(a, c, *e.tasks, e.settings, e.result.results_path, c.model ? nullptr : &e.given,
                                 progress, c.model ? &shared : nullptr, &counts);
    if (!records.ok()) {
      progress.finish();
      return records.status().with_context(e.result.column.column);
    }
    e.result.model = c.model != nullptr;
    e.result.generated = counts.generated, e.result.reused = counts.reused;
    e.result.ran = true;
    e.result.records = std::move(*records);
    e.result.summary = eval::summarize(e.tasks->tasks, e.result.records);
    e.result.columns = has_columns(e.tasks->tasks);
    out.push_back(std::move(e.result));
  }
  progress.finish();
  return Status::ok_status();
}

}  // namespace

int run_suite(const EvalArgs& a) {
  std::vector<eval::SuiteResult> results;
  if (Status s = run_suite_or_error(a, results); !s.ok()) return report(s);
  const nlohmann::json info = about(a);
  const nlohmann::json j = eval::suite_json(results, info);
  const std::string row = a.model_dir.empty() ? a.completions : a.model_dir;
  if (Status s = write_text_atomically(a.out_dir + "/summary.json", j.dump(2) + "\n"); !s.ok()) return report(s);
  if (Status s = write_text_atomically(a.out_dir + "/report.html", eval::suite_report_html(results, "diffucoder eval --suite paper: " + row, info));
      !s.ok())
    return report(s);
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s", eval::suite_table(results, row).c_str());
    if (a.limit > 0)
      std::printf("--limit %d: the first %d tasks of each benchmark, not the paper's whole sets\n", a.limit, a.limit);
    std::printf("summary: %s\nreport: %s\n", info["summary"].get<std::string>().c_str(),
                info["report"].get<std::string>().c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace dc::cli
