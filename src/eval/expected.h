// EvalPlus' differential testing, the trusted half: each task's expected outputs and reference times,
// computed by running its canonical solution on every input inside the sandbox (truth_runner.h) and cached
// per benchmark file; and the plan a sample's check follows (per-input time limits, inputs left out).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "eval/humaneval.h"

namespace dc::eval {

// One task's ground truth, as the truth runner printed it.
struct Expected {
  std::string blob;                           // base64 of marshal({"base": [...], "plus": [...]})
  std::vector<double> base_time, plus_time;   // [n_base], [n_plus]: the canonical solution's seconds per input
  std::vector<int64_t> base_skip, plus_skip;  // inputs the contract refuses: not run, for any sample
  nlohmann::json base_recompute, plus_recompute;  // outputs too large to keep: {"i": sha256 of marshal or ""}
};
using ExpectedMap = std::map<std::string, Expected>;  // task_id → its ground truth

// EvalPlus' defaults (evalplus/config.py): an input's time limit is max(min_time_limit, factor x the
// canonical solution's time on it).
inline constexpr double kDefaultMinTimeLimit = 1.0, kDefaultTimeLimitFactor = 4.0;

struct ExpectedOptions {
  std::string cache_dir;             // where <file key>.json lives; created when missing
  int workers = 2;                   // truth runs at once
  double task_timeout_seconds = 600; // wall clock of one task's truth run
  int64_t memory_bytes = 1ll << 30;  // a truth run's memory
};

// The cache key of a benchmark file: "<size>-<FNV-1a 64 of its bytes, hex>".
Result<std::string> benchmark_key(const std::string& path);

// The ground truth of every task of `tasks` with has_inputs: read from `cache_dir/<key>.json` where it
// holds them, the rest computed in the sandbox and the file rewritten atomically (temporary file +
// rename) with all it holds. A cache that is damaged (not JSON, another format or key, an entry of the
// wrong shape) is reported through `note` (naming the file and what is wrong) and rebuilt. A canonical
// solution that fails is an error naming the task and its message; an input that does not fit the task's
// input rule (oracles.h) a parse error naming the file, the task, the key and the argument.
Result<ExpectedMap> expected_outputs(const std::vector<Task>& tasks, const std::string& benchmark_path,
                                     const ExpectedOptions& options,
                                     const std::function<void(const std::string&)>& note);

// What one sample's check of `task` follows: the runner's plan.json text and the run's wall clock.
struct Plan {
  std::string json;  // {"oracle", "input_rule" (oracles.h), "expected", "{base,plus}_skip", "{base,plus}_recompute",
                     //  "{base,plus}_limits"}
  double wall_seconds = 0;
};
// Per-input limits max(min_time_limit, factor x time); the wall clock is EvalPlus' per-column timeout
// min(60, sum of the column's limits) + 1, for both columns, plus 2 s for python's start.
Plan make_plan(const Task& task, const Expected& expected, double min_time_limit, double factor);
using PlanMap = std::map<std::string, Plan>;

}  // namespace dc::eval
