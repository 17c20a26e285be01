// HumanEval-format benchmarks: loading (JSONL or JSONL.gz), the prompts a Base or an Instruct model
// gets, the code taken from a completion, the program the sandbox runs, and how its outcome is
// classified. pass@k lives in pass_at_k.h, the results file and the run loop in run.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "sandbox/sandbox.h"

namespace dc::eval {

// Which benchmark family a task belongs to: it decides the Base format's stop strings and EvalPlus'
// special oracles. MBPP tasks are those whose task_id starts with "Mbpp/".
enum class Dataset { kHumanEval, kMbpp };

// One problem: the fields of openai/human-eval's HumanEval.jsonl (canonical_solution optional), or a
// task of EvalPlus' HumanEval+ / MBPP+ format, or of the original MBPP (formats.h says how each maps).
struct Task {
  std::string task_id, prompt, entry_point, test, canonical_solution;
  Dataset dataset = Dataset::kHumanEval;
  std::string test_setup;  // MBPP's test_setup_code: run in the candidate's namespace before the test
  std::string check_function = "check";  // the test's function the runner calls with the candidate
  // EvalPlus' differential testing (has_inputs): `source` is the task's JSON line as read, from which the
  // sandbox takes base_input / plus_input (Python's json keeps HumanEval+'s integers past 64 bits exact);
  // n_base / n_plus count them; atol is the float tolerance, contract the input preconditions.
  bool has_inputs = false;
  std::string source, contract;
  size_t n_base = 0, n_plus = 0;
  double atol = 0;
};

// Reads a .jsonl or .jsonl.gz (gzip, detected by its magic bytes) file of tasks, in one of three formats
// (every line the same; formats.h): human-eval's, EvalPlus' (base_input / plus_input) or the original
// MBPP's (text / code / test_list; only the test split, task ids 11-510, is kept). Errors name the file
// and line: a line that is not valid UTF-8 (and the byte), not a JSON object, a missing or mistyped key
// (named), with an entry_point that is not a Python identifier, a duplicate task_id. More than
// `max_bytes` once decompressed is an error naming the file and the limit (HumanEval+ is 7.4 MiB).
inline constexpr size_t kMaxBenchmarkBytes = 256ull << 20;
Result<std::vector<Task>> load_tasks(const std::string& path, size_t max_bytes = kMaxBenchmarkBytes);

// How the model is prompted.
enum class PromptFormat {
  kBase,      // the raw prompt; the completion continues it
  kInstruct,  // chat format, prompt in a code block, assistant turn prefilled (EvalPlus' prompt)
};
const char* prompt_format_name(PromptFormat f);

// EvalPlus' instruction (evalplus codegen, used by Qwen2.5-Coder's eval_plus harness).
inline constexpr const char* kInstructionPrefix =
    "Please provide a self-contained Python script that solves the following problem in a markdown code block:";
inline constexpr const char* kResponsePrefix =
    "Below is a Python script with a self-contained function that solves the problem and passes corresponding "
    "tests:";

// The model's input text. kBase: `task.prompt` verbatim. kInstruct:
// "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + kInstructionPrefix +
// "\n```\n" + prompt.strip() + "\n```\n<|im_end|>\n<|im_start|>assistant\n" + kResponsePrefix + "\n```python\n".
std::string model_prompt(const Task& task, PromptFormat format);

// The program to test from a generated (post-processed) completion. kBase: prompt + the completion
// cut at the first of EvalPlus' stop strings: "\nif __name__", "\ndef main(", "\nprint(" and for
// HumanEval "\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ", for MBPP "\n\"\"\"", "\nassert".
// kInstruct: the text up to the closing fence "```" (the assistant turn opened the ```python block), i.e. a self-contained script.
std::string program_from_generation(const Task& task, const std::string& completion, PromptFormat format);

// The failure kinds of a sample.
enum class Failure { kNone, kAssertion, kException, kTimeout, kSyntax, kLimit };
const char* failure_name(Failure f);

struct CheckOptions {
  double timeout_seconds = 3.0;                 // human-eval's default per sample (wall, start included)
  int64_t memory_bytes = 1ll << 30;             // a sample's memory (sandbox::Limits::memory_bytes, RLIMIT_AS)
  int64_t max_processes = 32;
  int64_t output_bytes = 1 << 20;
};

// The sandbox run of one sample: `python3 -I /tmp/runner.py ENTRY_POINT test CHECK_FUNCTION` (check_runner.h;
// task.check_function, human-eval's `check`) with
// /tmp/program.py = `program`, /tmp/prompt.py = task.prompt, /tmp/test.py = task.test, /tmp/setup.py =
// task.test_setup when it has one (run in the candidate's namespace; the names it makes are passed to the
// test as references the candidate's process resolves) and the nonce on stdin. human-eval's check program (program + test + "check(entry_point)") split in two processes so that
// the verdict comes from one the candidate's code never runs in: a forked child executes the program in a
// fresh namespace as human-eval does (so `if __name__ == "__main__":` blocks do not run) and answers calls
// of the entry point; the runner executes the trusted prompt and test and calls check() with a proxy of
// the entry point. It reports a compile error (syntax), an AssertionError, any other exception (SystemExit,
// a process that ended, included), or success by printing the nonce, which it reads after the fork.
sandbox::RunSpec check_spec(const Task& task, const std::string& program, const CheckOptions& options,
                            const std::string& nonce);

struct Verdict {
  bool passed = false;
  Failure failure = Failure::kNone;
  std::string detail;  // e.g. "AssertionError: ", "NameError: name 'x' is not defined", "wall_time"
};
Verdict classify(const sandbox::RunResult& run, const std::string& nonce);

// EvalPlus' differential check of one sample (task.has_inputs): `python3 -I /tmp/runner.py ENTRY_POINT
// inputs` with /tmp/task.json = task.source and /tmp/plan.json = `plan_json` (expected.h make_plan). The
// same two processes as check_spec; the parent sends each base_input, then each plus_input, not skipped by
// the contract, as the call's arguments with the input's time limit (no answer in time: "timeout"), and
// compares the answer with the expected output as EvalPlus does: `==`, else for float outputs (or a task
// atol > 0) the same type and length and every number within atol + 1e-7 x |expected| (np.allclose),
// atol 1e-6 when the task's is 0 (kept for the rest of the column once set, as EvalPlus' loop does);
// each input is first rebuilt by the task's input rule (MBPP+'s tuples, sets, complex numbers) and the
// task's special oracle (oracles.h: HumanEval's find_zero, MBPP+'s set-equal, not-None and four
// per-task checks) decides instead of `==` where it has one. A mismatch is an "assertion" ("wrong answer:
// base input 3: expected ..., got ..."). After the base inputs pass it prints "<nonce> base" on stdout.
sandbox::RunSpec inputs_check_spec(const Task& task, const std::string& program, const std::string& plan_json,
                                   double wall_seconds, const CheckOptions& options, const std::string& nonce);

// The two columns of a differential check: base passes when the run printed "<nonce> base", plus when it
// passed as a whole (classify); a column that failed carries classify's kind (plus carries base's failure
// when base failed: a sample passes plus only when it passes base too).
struct ColumnVerdicts {
  Verdict base, plus;
};
ColumnVerdicts classify_columns(const sandbox::RunResult& run, const std::string& nonce);

// A fresh random nonce (hex) for check_spec / classify.
std::string make_nonce();

}  // namespace dc::eval
