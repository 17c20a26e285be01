// The evaluation run: the results file (one JSON line per sample after a settings line; resumable),
// checking samples through the sandbox pool with progress on stderr, and the summary (pass@k,
// failure kinds). The model side is the caller's (cli/eval.cc): it turns tasks into completions.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/expected.h"
#include "eval/humaneval.h"

namespace dc::eval {

// One sample to check: `program` is what runs (before the test is appended).
struct Sample {
  std::string task_id;
  int sample = 0;          // index among the task's samples
  std::string completion;  // as generated / given (recorded)
  std::string program;
  int64_t tokens = 0;      // generated tokens (0 for given completions)
};

// One line of the results file. `passed` / `failure` / `detail` are the base column (the only one of a
// human-eval or MBPP task: its test); has_plus marks a differential-testing task's second column.
struct SampleRecord {
  std::string task_id;
  int sample = 0;
  std::string completion;
  bool passed = false;
  Failure failure = Failure::kNone;
  std::string detail;
  double wall_ms = 0;
  int64_t tokens = 0;
  bool has_plus = false, passed_plus = false;
  Failure failure_plus = Failure::kNone;
  std::string detail_plus;
};
nlohmann::json to_json(const SampleRecord& r);
Result<SampleRecord> record_from_json(const nlohmann::json& j);

// The results file: first line {"settings": {...}}, then one SampleRecord per line, appended and
// flushed as each sample is checked, so a killed run loses at most the line being written.
class ResultsFile {
 public:
  // A new file (refused when `path` exists, unless `overwrite`), or with `resume` an existing one:
  // its settings must equal `settings` (the error names the first key that differs), its records are
  // kept, a partial last line is cut off; a record of a task not in `samples_per_task` (task id → the
  // number of samples this run checks) or of a sample number outside [0, n) is refused, naming the line.
  // `resume` on a missing file starts a new one.
  static Result<ResultsFile> open(const std::string& path, const nlohmann::json& settings, bool resume,
                                  bool overwrite, const std::map<std::string, int>& samples_per_task);
  ResultsFile(ResultsFile&& o) noexcept : path_(std::move(o.path_)), f_(o.f_), records_(std::move(o.records_)),
                                          done_(std::move(o.done_)) { o.f_ = nullptr; }
  ResultsFile(const ResultsFile&) = delete;
  ~ResultsFile();

  const std::vector<SampleRecord>& records() const { return records_; }
  bool done(const std::string& task_id, int sample) const { return done_.count({task_id, sample}) > 0; }
  Status append(const SampleRecord& r);

 private:
  ResultsFile() = default;
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<SampleRecord> records_;
  std::set<std::pair<std::string, int>> done_;
};

// Progress on stderr: samples done, pass rate so far, generated tokens/s, elapsed time, ETA. The ETA is the
// wall time per sample checked so far times the samples left: with generation and checks overlapped
// (check_pipeline.h) it covers both, whichever is the slower. Thread-safe (checks report from the pool's
// threads, generation from the caller's).
class Progress {
 public:
  Progress(int64_t total_samples, int64_t already_done, bool quiet);
  void add(const SampleRecord& r);
  void add_generation(int64_t tokens, double seconds);
  // Samples a resumed results file already holds: done, but not in the rate.
  void skip(int64_t samples);
  // A prefix naming what runs now (the suite's benchmark), e.g. "humaneval+".
  void set_label(const std::string& label);
  void finish();

 private:
  std::mutex mu_;
  int64_t total_, done_, passed_ = 0, new_done_ = 0, tokens_ = 0;
  double gen_seconds_ = 0;
  bool quiet_;
  double t0_;
  double last_print_ = -1;
  std::string label_;
};

// Checks `samples` (each against tasks.at(task_id)) with `workers` sandboxes at once; calls on_record
// (one call at a time, in completion order) with each result. A task with has_inputs is checked by
// differential testing (inputs_check_spec) with plans.at(task_id); the others by their test. A sandbox
// failure (not a failing program) is returned as an error after the running samples finish.
Status check_samples(const std::vector<Sample>& samples, const std::map<std::string, const Task*>& tasks,
                     const CheckOptions& options, int workers,
                     const std::function<Status(const SampleRecord&)>& on_record, const PlanMap& plans = {});

// One column's numbers: passed samples, pass@k (k → mean over tasks), failure kind → count.
struct Column {
  int64_t passed = 0;
  std::map<int, double> pass_at_k;
  std::map<std::string, int64_t> failures;
};
struct Summary {
  int64_t tasks = 0, samples = 0;
  int64_t min_samples = 0;                  // fewest samples of a task (pass@k needs k ≤ this)
  Column base;                              // the test (human-eval, MBPP) or EvalPlus' base inputs
  bool has_plus = false;                    // some record has a plus column
  Column plus;                              // base and plus inputs passed
  std::vector<std::string> missing;         // tasks without any sample
};
// pass@k for k = 1, 10, 100 (those ≤ min_samples) over `tasks`, from `records`, per column.
Summary summarize(const std::vector<Task>& tasks, const std::vector<SampleRecord>& records);
// The object `--json` prints: tasks, samples, samples_per_task, missing_tasks, and the base column's
// passed, pass_at_k and failures at the top (human-eval's keys); with `columns` (an EvalPlus or MBPP
// benchmark) also "base": {"pass_at_k", "passed", "failures"} and, when s.has_plus, "plus" likewise.
nlohmann::json summary_json(const Summary& s, bool columns = false);
// A markdown table: one value column, or with `columns` base and plus side by side.
std::string summary_table(const Summary& s, bool columns = false);

}  // namespace dc::eval
