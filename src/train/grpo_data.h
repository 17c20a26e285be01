// Coupled-GRPO training data (spec §4.1): JSON lines of prompts with their tests — {"prompt"} or
// {"messages"} with "tests", or AceCode-89K's own {"question", "test_cases"} as published — turned into
// the chat prompt the policy completes, tokenised and left-truncated to max_prompt_length tokens.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace dc::train {

// Limits of GRPO data (README "Limits"): the file (read whole), --max-prompt-length, and per example the
// number of tests and the bytes of one test.
inline constexpr int64_t kMaxGrpoDataBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxGrpoPromptLength = int64_t{1} << 20;
inline constexpr int64_t kMaxTestsPerExample = 4096;
inline constexpr int64_t kMaxTestBytes = int64_t{1} << 20;

struct GrpoDataOptions {
  int64_t max_prompt_length = 200;  // in [1, kMaxGrpoPromptLength]: the prompt's LAST this many tokens are kept
  bool chat = true;            // "prompt" strings go through the Qwen2.5 chat layout with the default system
                               // prompt (as "messages" and "question" always do); false: used verbatim (Base)
  bool require_tests = true;   // every example needs a non-empty test list (the code reward); false: optional
};

// One prompt of the data.
//   {"prompt": s, "tests": [s, ...]}          user message s (chat) or the raw text s (chat = false)
//   {"messages": [{"role", "content"}, ...], "tests": [...]}  the chat as given (a default system message
//                                             first when it has none); the last message must be the user's
//   {"question": s, "test_cases": [s, ...]}   AceCode-89K: spec §4.1's user message
//                                             (acecode_user_message), the tests are test_cases
// Other fields are kept (GrpoExample::fields) for a user reward program.
struct GrpoExample {
  int64_t line = 0;                 // 1-based line of the file
  std::string prompt_text;          // the formatted prompt (chat layout applied), before truncation
  std::vector<int32_t> prompt_ids;  // [<= max_prompt_length] the last max_prompt_length tokens of prompt_text
  int64_t n_truncated = 0;          // tokens cut from the left
  std::vector<std::string> tests;   // assert snippets ("tests" or "test_cases"), in file order
  nlohmann::json fields;            // the line's JSON object as read
};

struct GrpoDataset {
  std::string path;
  std::vector<GrpoExample> examples;
  int64_t n_truncated = 0;          // examples whose prompt was left-truncated
};

// spec §4.1 (grpo.py make_conversation): `question`, plus "\nTest cases: " + test_cases[0] when the
// question does not contain "\n```\n" (and test_cases is not empty).
std::string acecode_user_message(const std::string& question, const std::vector<std::string>& test_cases);

// Reads the JSONL file `path` (one example per non-blank line) and tokenises each prompt (no special
// tokens added; the chat markers are added tokens of the tokenizer). Errors name the file, the line and
// the field: not JSON, not an object, none or two of prompt / messages / question, a field of the wrong
// type, a bad role, tests missing or empty with require_tests, sizes past the limits above, no example.
Result<GrpoDataset> load_grpo_dataset(const std::string& path, const Tokenizer& tokenizer,
                                      const GrpoDataOptions& options);

}  // namespace dc::train
