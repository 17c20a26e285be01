#include "eval/humaneval.h"

#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "tokenizer/chat.h"

namespace dc::eval {

namespace {

// The whole file, gunzipped when it starts with the gzip magic bytes (zlib's gzread reads both).
Result<std::string> read_maybe_gzip(const std::string& path) {
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
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1ull << 31)) {
      gzclose(f);
      return out_of_range(path + ": more than 2 GiB of tasks");
    }
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

// The runner: reads the nonce, compiles and execs /tmp/program.py in a fresh namespace, reports.
constexpr const char* kRunner = R"PY(import sys
def _dc_run():
    nonce = sys.stdin.readline().strip()
    with open('/tmp/program.py') as f:
        src = f.read()
    try:
        code = compile(src, 'program.py', 'exec')
    except (SyntaxError, ValueError) as e:
        sys.stderr.write('\nDC_EVAL syntax %s: %s\n' % (type(e).__name__, e))
        sys.exit(2)
    try:
        exec(code, {})
    except AssertionError as e:
        sys.stderr.write('\nDC_EVAL assertion AssertionError: %s\n' % (e,))
        sys.exit(3)
    except MemoryError as e:
        sys.stderr.write('\nDC_EVAL limit MemoryError: %s\n' % (e,))
        sys.exit(4)
    except BaseException as e:
        sys.stderr.write('\nDC_EVAL exception %s: %s\n' % (type(e).__name__, str(e)[:200]))
        sys.exit(5)
    sys.stdout.flush()
    sys.stdout.write('\n' + nonce + '\n')
    sys.stdout.flush()
_dc_run()
)PY";

}  // namespace

Result<std::vector<Task>> load_tasks(const std::string& path) {
  DC_ASSIGN_OR_RETURN(std::string text, read_maybe_gzip(path));
  std::vector<Task> tasks;
  std::set<std::string> ids;
  std::istringstream in(text);
  std::string line;
  for (size_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(no);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return parse_error(where + ": not a JSON object");
    Task t;
    for (auto [field, dst] : {std::pair<const char*, std::string*>{"task_id", &t.task_id}, {"prompt", &t.prompt},
                              {"entry_point", &t.entry_point}, {"test", &t.test}}) {
      if (!j.contains(field) || !j[field].is_string())
        return parse_error(where + ": needs a string \"" + std::string(field) + "\"");
      *dst = j[field].get<std::string>();
    }
    if (j.contains("canonical_solution") && j["canonical_solution"].is_string())
      t.canonical_solution = j["canonical_solution"].get<std::string>();
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
  for (const char* stop : {"\ndef ", "\nclass ", "\nimport ", "\nfrom ", "\nassert ", "\nif __name__", "\ndef main(",
                           "\nprint("}) {
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
  s.argv = {"python3", "-I", "/tmp/runner.py"};
  s.files["program.py"] = program + "\n\n" + task.test + "\n\ncheck(" + task.entry_point + ")\n";
  s.files["runner.py"] = kRunner;
  s.stdin_data = nonce + "\n";
  s.limits.wall_seconds = o.timeout_seconds;
  s.limits.cpu_seconds = o.timeout_seconds + 1;
  s.limits.address_space_bytes = o.memory_bytes;
  s.limits.max_processes = o.max_processes;
  s.limits.output_bytes = o.output_bytes;
  return s;
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
