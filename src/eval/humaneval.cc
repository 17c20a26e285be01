#include "eval/humaneval.h"

#include <zlib.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string_view>

#include "eval/check_runner.h"
#include "eval/formats.h"
#include "eval/oracles.h"
#include "tokenizer/chat.h"
#include "tokenizer/utf8.h"

namespace dc::eval {

namespace {

// The whole file, gunzipped when it starts with the gzip magic bytes (zlib's gzread reads both); more
// than `max_bytes` once decompressed is an error naming the file and the limit (a small .gz may inflate
// to gigabytes).
Result<std::string> read_maybe_gzip(const std::string& path, size_t max_bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return not_found("cannot open benchmark file " + path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return io_error("reading " + path + ": " + msg);
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      gzclose(f);
      return out_of_range(path + ": more than " + std::to_string(max_bytes) +
                          " bytes once decompressed (the limit for a benchmark file)");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  gzclose(f);
  return out;
}

std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace

Result<std::vector<Task>> load_tasks(const std::string& path, size_t max_bytes) {
  DC_ASSIGN_OR_RETURN(std::string text, read_maybe_gzip(path, max_bytes));
  std::vector<Task> tasks;
  std::set<std::string> ids;
  std::optional<Format> format;
  size_t no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(no);
    if (auto bad = utf8::find_invalid(line))
      return parse_error(where + ": not valid UTF-8 (byte " + std::to_string(*bad + 1) + " of the line)");
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return parse_error(where + ": not a JSON object");
    const Format f = detect_format(j);
    if (!format) format = f;
    if (f != *format)
      return parse_error(where + ": a task in " + format_name(f) + " format, but the file's first task is in " +
                         format_name(*format) + " format");
    DC_ASSIGN_OR_RETURN(std::optional<Task> task, parse_task(j, f, line, where));
    if (!task) continue;
    Task& t = *task;
    if (!ids.insert(t.task_id).second) return parse_error(where + ": duplicate task_id " + t.task_id);
    tasks.push_back(std::move(t));
  }
  if (tasks.empty()) return parse_error(path + " holds no tasks");
  return tasks;
}

const char* prompt_format_name(PromptFormat f) { return f == PromptFormat::kBase ? "base" : "instruct"; }

std::string model_prompt(const Task& task, PromptFormat format) {
  if (format == PromptFormat::kBase) return task.prompt;
  const std::string user = std::string(kInstructionPrefix) + "\n```\n" + strip(task.prompt) + "\n```\n";
  auto chat = format_chat({{"user", user}}, /*add_generation_prompt=*/true);
  return *chat + kResponsePrefix + "\n```python\n";
}

std::string program_from_generation(const Task& task, const std::string& completion, PromptFormat format) {
  if (format == PromptFormat::kInstruct) {
    size_t fence = completion.find("```");
    return fence == std::string::npos ? completion : completion.substr(0, fence);
  }
  size_t cut = completion.size();
  const auto stops = task.dataset == Dataset::kMbpp
                         ? std::vector<const char*>{"\n\"\"\"", "\nassert", "\nif __name__", "\ndef main(", "\nprint("}
                         : std::vector<const char*>{"\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ",
                                                    "\nif __name__", "\ndef main(", "\nprint("};
  for (const char* stop : stops) {
    size_t at = completion.find(stop);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  return task.prompt + completion.substr(0, cut);
}

const char* failure_name(Failure f) {
  switch (f) {
    case Failure::kNone: return "none";
    case Failure::kAssertion: return "assertion";
    case Failure::kException: return "exception";
    case Failure::kTimeout: return "timeout";
    case Failure::kSyntax: return "syntax";
    case Failure::kLimit: return "limit";
  }
  return "none";
}

sandbox::RunSpec check_spec(const Task& task, const std::string& program, const CheckOptions& o,
                            const std::string& nonce) {
  sandbox::RunSpec s;
  s.argv = {"python3", "-I", "/tmp/runner.py", task.entry_point, "test", task.check_function};
  s.files["program.py"] = program;
  s.files["prompt.py"] = task.prompt;
  s.files["test.py"] = task.test;
  if (!task.test_setup.empty()) s.files["setup.py"] = task.test_setup;
  s.files["runner.py"] = std::string(kEvalPlusPython) + kCheckRunner;
  s.stdin_data = nonce + "\n";
  s.limits.wall_seconds = o.timeout_seconds;
  s.limits.cpu_seconds = o.timeout_seconds + 1;
  s.limits.address_space_bytes = o.memory_bytes;  // one process may use the whole budget (cgroup mode)
  s.limits.memory_bytes = o.memory_bytes;         // the sample's whole budget: processes x address space
  s.limits.max_processes = o.max_processes;
  s.limits.output_bytes = o.output_bytes;
  return s;
}

sandbox::RunSpec inputs_check_spec(const Task& task, const std::string& program, const std::string& plan_json,
                                   double wall_seconds, const CheckOptions& o, const std::string& nonce) {
  sandbox::RunSpec s = check_spec(task, program, o, nonce);
  s.argv[4] = "inputs";
  s.files.erase("prompt.py"), s.files.erase("test.py");
  s.files["task.json"] = task.source;
  s.files["plan.json"] = plan_json;
  s.limits.wall_seconds = wall_seconds;
  s.limits.cpu_seconds = wall_seconds + 1;
  s.limits.tmp_bytes = 256ll << 20;
  // The runner and the candidate's process: without a cgroup each may use a quarter of the memory (RLIMIT_AS;
  // HumanEval+'s large inputs need more than the 64 MiB that 32 processes would leave each).
  s.limits.max_processes = std::min<int64_t>(o.max_processes, 4);
  return s;
}

ColumnVerdicts classify_columns(const sandbox::RunResult& run, const std::string& nonce) {
  ColumnVerdicts v;
  v.plus = classify(run, nonce);
  if (run.stdout_data.find("\n" + nonce + " base\n") != std::string::npos) v.base.passed = true;
  else v.base = v.plus;
  return v;
}

Verdict classify(const sandbox::RunResult& run, const std::string& nonce) {
  using sandbox::LimitHit;
  Verdict v;
  const std::string& out = run.stdout_data;
  const std::string tail = "\n" + nonce + "\n";
  if (run.ok() && out.size() >= tail.size() && out.compare(out.size() - tail.size(), tail.size(), tail) == 0) {
    v.passed = true;
    return v;
  }
  if (run.limit == LimitHit::kWallTime || run.limit == LimitHit::kCpuTime) {
    v.failure = Failure::kTimeout;
    v.detail = sandbox::limit_hit_name(run.limit);
    return v;
  }
  // The runner's report is the last "DC_EVAL <kind> <detail>" line of stderr.
  const std::string& err = run.stderr_data;
  size_t at = err.rfind("\nDC_EVAL ");
  if (at != std::string::npos) {
    std::string line = err.substr(at + 9);
    line = line.substr(0, line.find('\n'));
    std::string kind = line.substr(0, line.find(' '));
    v.detail = line.size() > kind.size() ? line.substr(kind.size() + 1) : "";
    if (kind == "syntax") v.failure = Failure::kSyntax;
    else if (kind == "assertion") v.failure = Failure::kAssertion;
    else if (kind == "timeout") v.failure = Failure::kTimeout;
    else if (kind == "limit") v.failure = Failure::kLimit;
    else v.failure = Failure::kException;
  } else if (run.limit != LimitHit::kNone) {
    v.failure = Failure::kLimit;
    v.detail = sandbox::limit_hit_name(run.limit);
    return v;
  } else {
    v.failure = Failure::kException;
    v.detail = run.signal ? "killed by signal " + std::to_string(run.signal)
                          : "exit code " + std::to_string(run.exit_code) + " without a report";
  }
  if (run.limit != LimitHit::kNone && run.limit != LimitHit::kWallTime) {
    v.failure = Failure::kLimit;  // e.g. "Too many open files" raised as an exception
    v.detail = std::string(sandbox::limit_hit_name(run.limit)) + ": " + v.detail;
  }
  return v;
}

std::string make_nonce() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + 8 * i, 9, "%08x", static_cast<unsigned>(rd()));
  return std::string("DC_PASS_") + buf;
}

}  // namespace dc::eval
