// Coupled-GRPO rewards (spec §4.3): `code_format` (the fenced-block regex, then ast.parse) and `code` (the
// pass rate of the example's tests), every program run in the sandbox (src/sandbox/), and a user's own
// reward program (train/user_reward.h); combined as nansum(weight · reward) per completion.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "train/grpo_data.h"
#include "train/rollout.h"
#include "train/user_reward.h"

namespace dc::train {

// The code_format regex of the reference (rewards.py, language "python"), matched as Python's
// re.fullmatch (the whole text, PCRE2 anchored at both ends): text without ``` , the ```python fence and a
// newline, code without ``` , then ``` and a newline that end the text.
inline constexpr std::string_view kCodeFormatPattern = R"(^(?:(?!```)[\s\S])*?```python\n(?:(?!```)[\s\S])*?```\n$)";

// Whether `text` fullmatches kCodeFormatPattern (bytes; any text, valid UTF-8 or not).
bool matches_code_format(std::string_view text);

// The code of the first ```python block: the text after the first "```python\n" up to the next "```"
// (unstripped; to the end when there is no closing fence); nullopt when there is no "```python\n".
std::optional<std::string> extract_python_block(std::string_view text);

// How the sandboxed programs of the code rewards run.
struct CodeRewardOptions {
  double timeout_seconds = 5.0;             // wall clock of each test case (and of each ast.parse run)
  int64_t memory_bytes = int64_t{1} << 30;  // a run's memory (sandbox::Limits::memory_bytes and RLIMIT_AS)
  int64_t max_processes = 64;               // RLIMIT_NPROC of a run
  int workers = 0;                          // sandboxes at once; <= 0: the hardware threads
};

// One completion to score: its example (prompt, tests, fields) and its decoded text (rollout.h
// completion_text).
struct RewardInput {
  const GrpoExample* example = nullptr;  // not owned
  std::string prompt;                    // the prompt text the policy completed (example->prompt_text)
  std::string completion;
};

// The inputs of a round of rollouts: row r of `batch` (its text) is a completion of examples[r / group_size],
// the examples being those whose prompt_ids were given to generate_rollouts, in that order (not owned; must
// outlive the inputs). invalid_argument when examples.size() != batch.n_prompts or one is null.
Result<std::vector<RewardInput>> reward_inputs(const RolloutBatch& batch, const std::vector<const GrpoExample*>& examples);

// code_format per completion (spec §4.3): 0 when the text does not match kCodeFormatPattern; else the
// first python block, stripped (Python str.strip()), is parsed with ast.parse by python3 in the sandbox:
// 1.0 when it parses, 0.5 when it does not (a SyntaxError; also any other failure of the parse, e.g. a
// null byte, where the reference would raise). Error only when the sandbox itself fails.
Result<std::vector<double>> code_format_rewards(const std::vector<RewardInput>& inputs, const CodeRewardOptions& options);

// The code reward's detail for one completion.
struct CodeResult {
  double reward = 0;      // passed / total, or 0 (not run, or a test timed out)
  bool ran = false;       // format was 1.0 and the example has tests
  int64_t passed = 0;     // test cases that ran to their end and exited with code 0
  int64_t total = 0;      // the example's test cases
  bool timed_out = false; // some test case hit the timeout (the reference's script then raises: reward 0)
};

// code per completion (spec §4.3), given its code_format reward: only completions with format == 1.0 run;
// the first python block (unstripped) is `code`, and each test case t of the example runs in its own
// sandbox as the program "<code>\n<t>" (executed as `python3 -c` would, by code_reward_runner.h) with
// options.timeout_seconds of wall clock; it passes when it ran to its end (every statement of t executed)
// and exited with code 0. Reward = passed / total, or 0 when any test case timed out (the reference's
// evaluation script raises TimeoutExpired and prints no pass rate). Unlike the reference, a program that
// exits 0 before its test ran (sys.exit(0), os._exit(0)) fails. Hostile programs (fork bombs, endless loops, huge
// allocations, file writes, network) are contained by the sandbox's namespaces and limits and fail.
// Error only when the sandbox itself fails.
Result<std::vector<CodeResult>> code_rewards(const std::vector<RewardInput>& inputs,
                                             const std::vector<double>& format_rewards,
                                             const CodeRewardOptions& options);

// Which rewards a run uses and their weights (spec §4.3 / §4.7: code 2.0, code_format 0.5). A weight of 0
// turns a reward off (code still computes code_format for its gate).
struct RewardOptions {
  double code_weight = 2.0;
  double format_weight = 0.5;
  CodeRewardOptions code;
  UserRewardOptions user;       // user.argv empty: no user reward
  double user_weight = 1.0;
};

// Every reward of a batch of completions. Per-reward vectors are [n] or empty when the reward is off.
struct RewardBatch {
  std::vector<double> code_format;  // 0 / 0.5 / 1
  std::vector<CodeResult> code;
  std::vector<double> user;         // the user program's scores (NaN allowed)
  std::vector<double> total;        // [n] nansum over the rewards on of weight · reward (NaN counts as 0)
  double seconds = 0;               // wall time of score_completions

  double format_rate() const;       // fraction of completions with code_format == 1 (0 when off or n = 0)
  double pass_rate() const;         // mean code reward (0 when off or n = 0)
};

// Scores every input with the rewards `options` turns on (code_format and code in parallel over the
// sandbox pool, then the user program once over all inputs). Errors: a sandbox failure, a user program
// failure (user_reward.h), an input without an example, the code reward on an example without tests.
Result<RewardBatch> score_completions(const std::vector<RewardInput>& inputs, const RewardOptions& options);

}  // namespace dc::train
