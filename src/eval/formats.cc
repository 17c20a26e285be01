#include "eval/formats.h"

#include <cctype>
#include <cmath>

namespace dc::eval {

namespace {

// An ASCII Python identifier: [A-Za-z_][A-Za-z0-9_]* (the entry point is passed to the runner).
bool is_identifier(const std::string& s) {
  if (s.empty() || s.size() > 256 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

Status need_string(const nlohmann::json& j, const char* key, std::string* out, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string()) return parse_error(where + ": needs a string \"" + key + "\"");
  *out = j[key].get<std::string>();
  return Status::ok_status();
}

Status check_entry_point(const Task& t, const std::string& where) {
  if (!is_identifier(t.entry_point))
    return parse_error(where + ": entry_point \"" + t.entry_point.substr(0, 80) + "\" is not a Python identifier");
  return Status::ok_status();
}

// base_input / plus_input: a list whose every element is a list (one call's arguments).
Result<size_t> count_inputs(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_array()) return parse_error(where + ": \"" + key + "\" must be a list of argument lists");
  const auto& a = j[key];
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].is_array())
      return parse_error(where + ": \"" + key + "\"[" + std::to_string(i) + "] is not a list (each input is the list of a call's arguments)");
  return a.size();
}

// The names `code` defines with a `def NAME(` at the start of a line, in order.
std::vector<std::string> defined_functions(const std::string& code) {
  std::vector<std::string> out;
  for (size_t at = 0; (at = code.find("def ", at)) != std::string::npos; at += 4) {
    if (at > 0 && code[at - 1] != '\n') continue;
    size_t b = code.find_first_not_of(' ', at + 4), e = b;
    while (e < code.size() && ident_char(code[e])) ++e;
    if (e > b && code.find_first_not_of(' ', e) != std::string::npos && code[code.find_first_not_of(' ', e)] == '(')
      out.push_back(code.substr(b, e - b));
  }
  return out;
}

// Whether `text` calls `name`: the name as a whole word followed (after spaces) by "(".
bool calls(const std::string& text, const std::string& name) {
  for (size_t at = 0; (at = text.find(name, at)) != std::string::npos; ++at) {
    const size_t end = at + name.size();
    if ((at > 0 && ident_char(text[at - 1])) || (end < text.size() && ident_char(text[end]))) continue;
    const size_t next = text.find_first_not_of(' ', end);
    if (next != std::string::npos && text[next] == '(') return true;
  }
  return false;
}

Result<std::optional<Task>> parse_humaneval(const nlohmann::json& j, const std::string& where) {
  Task t;
  for (auto [key, dst] : {std::pair<const char*, std::string*>{"task_id", &t.task_id}, {"prompt", &t.prompt},
                          {"entry_point", &t.entry_point}, {"test", &t.test}})
    DC_RETURN_IF_ERROR(need_string(j, key, dst, where));
  DC_RETURN_IF_ERROR(check_entry_point(t, where));
  if (j.contains("canonical_solution") && j["canonical_solution"].is_string())
    t.canonical_solution = j["canonical_solution"].get<std::string>();
  return std::optional<Task>(std::move(t));
}

Result<std::optional<Task>> parse_evalplus(const nlohmann::json& j, std::string_view line, const std::string& where) {
  Task t;
  for (auto [key, dst] : {std::pair<const char*, std::string*>{"task_id", &t.task_id}, {"prompt", &t.prompt},
                          {"entry_point", &t.entry_point}, {"canonical_solution", &t.canonical_solution}})
    DC_RETURN_IF_ERROR(need_string(j, key, dst, where));
  DC_RETURN_IF_ERROR(check_entry_point(t, where));
  DC_ASSIGN_OR_RETURN(t.n_base, count_inputs(j, "base_input", where));
  DC_ASSIGN_OR_RETURN(t.n_plus, count_inputs(j, "plus_input", where));
  if (!j.contains("atol") || !j["atol"].is_number() || !std::isfinite(j["atol"].get<double>()) || j["atol"].get<double>() < 0)
    return parse_error(where + ": needs a number \"atol\" >= 0 (the float tolerance; 0 for none)");
  t.atol = j["atol"].get<double>();
  if (j.contains("contract") && !j["contract"].is_string()) return parse_error(where + ": \"contract\" must be a string");
  if (j.contains("contract")) t.contract = j["contract"].get<std::string>();
  if (j.contains("test") && j["test"].is_string()) t.test = j["test"].get<std::string>();
  t.dataset = t.task_id.rfind("Mbpp/", 0) == 0 ? Dataset::kMbpp : Dataset::kHumanEval;
  t.has_inputs = true;
  t.source = std::string(line);
  return std::optional<Task>(std::move(t));
}

Result<std::optional<Task>> parse_mbpp(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("task_id") || !j["task_id"].is_number_integer()) return parse_error(where + ": needs an integer \"task_id\"");
  const int64_t id = j["task_id"].get<int64_t>();
  if (id < 11 || id > 510) return std::optional<Task>();  // not the test split
  Task t;
  std::string text;
  DC_RETURN_IF_ERROR(need_string(j, "text", &text, where));
  DC_RETURN_IF_ERROR(need_string(j, "code", &t.canonical_solution, where));
  if (j.contains("test_setup_code")) DC_RETURN_IF_ERROR(need_string(j, "test_setup_code", &t.test_setup, where));
  if (!j.contains("test_list") || !j["test_list"].is_array() || j["test_list"].empty())
    return parse_error(where + ": needs a non-empty list of strings \"test_list\"");
  std::vector<std::string> tests;
  for (const auto& a : j["test_list"]) {
    if (!a.is_string()) return parse_error(where + ": \"test_list\" must hold strings (assert lines)");
    tests.push_back(a.get<std::string>());
  }
  t.task_id = "Mbpp/" + std::to_string(id);
  t.dataset = Dataset::kMbpp;
  t.prompt = "\"\"\"\n" + text + "\n" + tests[0] + "\n\"\"\"\n";
  for (const std::string& name : defined_functions(t.canonical_solution))
    if (calls(tests[0], name)) {
      t.entry_point = name;
      break;
    }
  if (t.entry_point.empty())
    return parse_error(where + ": \"test_list\"[0] calls no function that \"code\" defines (the entry point)");
  DC_RETURN_IF_ERROR(check_entry_point(t, where));
  // Not named `check`: MBPP's own functions may be (tasks 56, 349), and the asserts call them by name.
  t.check_function = "_dc_mbpp_check";
  t.test = "def _dc_mbpp_check(candidate):\n";
  for (const std::string& a : tests) {
    if (a.find('\n') != std::string::npos) return parse_error(where + ": \"test_list\" holds a line break inside an assert");
    t.test += "    " + a + "\n";
  }
  return std::optional<Task>(std::move(t));
}

}  // namespace

const char* format_name(Format f) {
  switch (f) {
    case Format::kHumanEval: return "human-eval";
    case Format::kEvalPlus: return "EvalPlus";
    case Format::kMbpp: return "MBPP";
  }
  return "human-eval";
}

Format detect_format(const nlohmann::json& j) {
  if (j.contains("text") && j.contains("test_list")) return Format::kMbpp;
  if (j.contains("base_input")) return Format::kEvalPlus;
  return Format::kHumanEval;
}

Result<std::optional<Task>> parse_task(const nlohmann::json& j, Format f, std::string_view line, const std::string& where) {
  switch (f) {
    case Format::kHumanEval: return parse_humaneval(j, where);
    case Format::kEvalPlus: return parse_evalplus(j, line, where);
    case Format::kMbpp: return parse_mbpp(j, where);
  }
  return parse_humaneval(j, where);
}

}  // namespace dc::eval
