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

// One problem: the fields of openai/human-eval's HumanEval.jsonl (canonical_solution optional).
struct Task {
  std::string task_id, prompt, entry_point, test, canonical_solution;
};

// Reads a .jsonl or .jsonl.gz (gzip, detected by its magic bytes) file of tasks. Errors name the file
// and line: a line that is not valid UTF-8 (and the byte), not a JSON object, without a string field, with
// an entry_point that is not a Python identifier, a duplicate task_id. More than `max_bytes` once
// decompressed is an error naming the file and the limit (HumanEval+ is 7.4 MiB).
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
// cut at the first of EvalPlus' HumanEval stop strings ("\ndef ", "\nclass ", "\nimport ", "\nfrom ",
// "\nassert ", "\nif __name__", "\ndef main(", "\nprint("). kInstruct: the text up to the closing
// fence "```" (the assistant turn opened the ```python block), i.e. a self-contained script.
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

// The sandbox run of one sample: `python3 -I /tmp/runner.py ENTRY_POINT` (check_runner.h) with
// /tmp/program.py = `program`, /tmp/prompt.py = task.prompt, /tmp/test.py = task.test and the nonce on
// stdin. human-eval's check program (program + test + "check(entry_point)") split in two processes so that
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

// A fresh random nonce (hex) for check_spec / classify.
std::string make_nonce();

}  // namespace dc::eval
