// `eval --suite paper`: the benchmarks of DiffuCoder's table (HumanEval, HumanEval+, MBPP, MBPP+) run one after
// the other, and what is made of their results: the paper's row (pass@1 in percent per column, and the mean of
// the columns present) as a markdown table and as JSON, and the HTML report (report.h). The runs themselves
// are the CLI's (cli/eval_suite.cc); this is their summary.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/run.h"

namespace dc::eval {

// One column of the paper's table and the benchmark it is read from.
struct SuiteColumn {
  const char* column;     // the paper's heading: "HumanEval", "HumanEval+", "MBPP", "MBPP+"
  const char* benchmark;  // --benchmark's name: "humaneval", "humaneval+", "mbpp", "mbpp+"
  const char* file_stem;  // the results file in the output directory: <stem>.jsonl
  bool plus;              // the column is EvalPlus' plus one (base and plus inputs passed)
};
// The four, in the paper's order.
const std::vector<SuiteColumn>& paper_columns();

// One benchmark of a suite run: its column, and (when it ran) its task ids in order and its records.
struct SuiteResult {
  SuiteColumn column;
  bool ran = false;
  std::string not_run;      // why it did not run (MBPP+ without --mbpp-plus)
  std::string results_path;  // the results file
  std::vector<std::string> task_ids;  // the run's tasks, in the benchmark's order
  std::vector<SampleRecord> records;
  Summary summary;
  bool columns = false;     // base / plus columns (EvalPlus and MBPP), as summary_json's `columns`
  // Model mode: the samples this process decoded for it, and those whose completions it took from an earlier
  // benchmark of the suite decoded from the same prompts (`reused_from`, its column: HumanEval for HumanEval+).
  bool model = false;
  int64_t generated = 0, reused = 0;
  std::string reused_from;
};

// The paper's number of a result: pass@1 of its column (plus for HumanEval+ / MBPP+, else base), nullopt when it
// did not run or has no such column.
std::optional<double> suite_pass_at_1(const SuiteResult& r);
// The mean of the columns that have a number (nullopt when none has).
std::optional<double> suite_mean(const std::vector<SuiteResult>& results);
// A table cell: the value in percent with one decimal ("73.2"), or "n/a".
std::string suite_percent(std::optional<double> v);

// `--json`'s object (also summary.json): {"suite": "paper", "row": {"HumanEval": pass@1 or null, ..., "mean"},
// "columns_in_mean", "not_run": {column: why}, "benchmarks": {name: summary_json + "results", "column", and in
// model mode "generated", "reused" and, when it reused any, "reused_from"}} and the fields of `about` (model or
// completions, limit, paths of the files written).
nlohmann::json suite_json(const std::vector<SuiteResult>& results, const nlohmann::json& about);
// The paper's row as a markdown table (percent, one decimal; "n/a" where a column did not run), under it a
// line per column that did not run saying why, and the tasks and samples of each (and the samples whose
// completions it reused).
std::string suite_table(const std::vector<SuiteResult>& results, const std::string& row_name);

}  // namespace dc::eval
