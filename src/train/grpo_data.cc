// load_grpo_dataset: JSONL prompt / messages / AceCode lines → chat prompts, left-truncated token ids, tests.
#include "train/grpo_data.h"

#include <algorithm>

#include "tokenizer/chat.h"
#include "train/data.h"

namespace dc::train {
namespace {

using Json = nlohmann::json;

// The list of strings `key` of `j` (each at most kMaxTestBytes, at most kMaxTestsPerExample of them).
Result<std::vector<std::string>> string_list(const Json& j, const char* key, const std::string& where) {
  const Json& list = j[key];
  if (!list.is_array()) return invalid_argument(where + ": \"" + key + "\" must be a list of strings");
  if (static_cast<int64_t>(list.size()) > kMaxTestsPerExample)
    return out_of_range(where + ": \"" + key + "\" has " + std::to_string(list.size()) + " entries, more than the limit of " +
                        std::to_string(kMaxTestsPerExample));
  std::vector<std::string> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + ": \"" + key + "\"[" + std::to_string(i) + "]";
    if (!list[i].is_string()) return invalid_argument(at + " is not a string");
    if (static_cast<int64_t>(list[i].get_ref<const std::string&>().size()) > kMaxTestBytes)
      return out_of_range(at + " is longer than the limit of " + std::to_string(kMaxTestBytes) + " bytes");
    out.push_back(list[i].get<std::string>());
  }
  return out;
}

// The prompt text (chat layout applied) and the tests of one line.
Status parse_line(const Json& j, const GrpoDataOptions& o, const std::string& where, GrpoExample& ex) {
  const int sources = static_cast<int>(j.contains("prompt")) + static_cast<int>(j.contains("messages")) +
                      static_cast<int>(j.contains("question"));
  if (sources != 1)
    return invalid_argument(where + ": needs exactly one of \"prompt\", \"messages\" (with \"tests\") or \"question\" "
                            "(AceCode, with \"test_cases\"); found " + std::to_string(sources));
  if (j.contains("tests") && j.contains("test_cases"))
    return invalid_argument(where + ": has both \"tests\" and \"test_cases\"; keep one");
  const char* tests_key = j.contains("test_cases") ? "test_cases" : "tests";
  if (j.contains(tests_key)) {
    DC_ASSIGN_OR_RETURN(ex.tests, string_list(j, tests_key, where));
  }
  if (o.require_tests && ex.tests.empty())
    return invalid_argument(where + ": needs a non-empty \"tests\" list (\"test_cases\" for AceCode lines): the code "
                            "reward runs them");
  if (j.contains("question")) {
    DC_ASSIGN_OR_RETURN(std::string question, string_field(j, "question", where));
    DC_ASSIGN_OR_RETURN(ex.prompt_text, format_chat({{"user", acecode_user_message(question, ex.tests)}}));
  } else if (j.contains("messages")) {
    DC_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, parse_chat_messages(j["messages"], where));
    if (messages.back().role != "user")
      return invalid_argument(where + ": the last message must be the user's (the policy writes the answer), not \"" +
                              messages.back().role + "\"");
    auto formatted = format_chat(messages);
    if (!formatted.ok()) return invalid_argument(where + ": " + formatted.status().message());
    ex.prompt_text = std::move(*formatted);
  } else {
    DC_ASSIGN_OR_RETURN(std::string prompt, string_field(j, "prompt", where));
    if (o.chat) {
      DC_ASSIGN_OR_RETURN(ex.prompt_text, format_chat({{"user", prompt}}));
    } else {
      ex.prompt_text = std::move(prompt);
    }
  }
  return Status();
}

}  // namespace

std::string acecode_user_message(const std::string& question, const std::vector<std::string>& test_cases) {
  if (question.find("\n```\n") != std::string::npos || test_cases.empty()) return question;
  return question + "\nTest cases: " + test_cases[0];
}

Result<GrpoDataset> load_grpo_dataset(const std::string& path, const Tokenizer& tokenizer, const GrpoDataOptions& o) {
  if (o.max_prompt_length < 1 || o.max_prompt_length > kMaxGrpoPromptLength)
    return invalid_argument("max_prompt_length: must be in [1, " + std::to_string(kMaxGrpoPromptLength) + "], got " +
                            std::to_string(o.max_prompt_length));
  GrpoDataset ds;
  ds.path = path;
  DC_RETURN_IF_ERROR(for_each_json_object(path, kMaxGrpoDataBytes, [&](Json& j, int64_t line_no,
                                                                      const std::string& where) -> Status {
    GrpoExample ex;
    ex.line = line_no;
    ex.fields = std::move(j);
    DC_RETURN_IF_ERROR(parse_line(ex.fields, o, where, ex));
    auto ids = tokenizer.encode(ex.prompt_text);
    if (!ids.ok()) return invalid_argument(where + ": " + ids.status().message());
    if (ids->empty()) return invalid_argument(where + ": the prompt encodes to no tokens");
    const int64_t n = static_cast<int64_t>(ids->size());
    ex.n_truncated = std::max<int64_t>(0, n - o.max_prompt_length);
    ex.prompt_ids.assign(ids->begin() + ex.n_truncated, ids->end());
    if (ex.n_truncated > 0) ++ds.n_truncated;
    ds.examples.push_back(std::move(ex));
    return Status();
  }));
  if (ds.examples.empty()) return invalid_argument(path + ": holds no example (one JSON object per line)");
  return ds;
}

}  // namespace dc::train
