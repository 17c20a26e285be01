#include "eval/expected.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "eval/oracles.h"
#include "eval/truth_runner.h"
#include "io/atomic_dir.h"
#include "io/mapped_file.h"
#include "sandbox/pool.h"

namespace dc::eval {

namespace {

// 2: MBPP+ inputs rebuilt by their rules and not_none outputs (oracles.h); caches of format 1 are rebuilt.
constexpr const char* kCacheFormat = "diffucoder-evalplus-expected-2";

// The JSON of one task's ground truth, and back (nullopt-like error text when the shape is wrong).
nlohmann::json to_json(const Expected& e) {
  return {{"expected", e.blob},          {"base_time", e.base_time},           {"plus_time", e.plus_time},
          {"base_skip", e.base_skip},     {"plus_skip", e.plus_skip},           {"base_recompute", e.base_recompute},
          {"plus_recompute", e.plus_recompute}};
}

// Reads one task's ground truth; the error says what is wrong with its shape (lengths against the task's inputs).
Result<Expected> from_json(const nlohmann::json& j, const Task& t) {
  Expected e;
  if (!j.is_object() || !j.contains("expected") || !j["expected"].is_string()) return parse_error("no string \"expected\"");
  e.blob = j["expected"].get<std::string>();
  for (auto [col, n, times, skip, again] :
       {std::tuple{"base", t.n_base, &e.base_time, &e.base_skip, &e.base_recompute},
        std::tuple{"plus", t.n_plus, &e.plus_time, &e.plus_skip, &e.plus_recompute}}) {
    const std::string tk = std::string(col) + "_time";
    if (!j.contains(tk) || !j[tk].is_array() || j[tk].size() != n)
      return parse_error("\"" + tk + "\" is not a list of " + std::to_string(n) + " times");
    for (const auto& x : j[tk]) {
      if (!x.is_number() || !(x.get<double>() >= 0)) return parse_error("\"" + tk + "\" holds a value that is not a time");
      times->push_back(x.get<double>());
    }
    const std::string sk = col + std::string("_skip"), rk = col + std::string("_recompute");
    if (!j.contains(sk) || !j[sk].is_array()) return parse_error("no list \"" + sk + "\"");
    for (const auto& x : j[sk]) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() >= n) return parse_error("\"" + sk + "\" holds an index out of range");
      skip->push_back(x.get<int64_t>());
    }
    if (!j.contains(rk) || !j[rk].is_object()) return parse_error("no object \"" + rk + "\"");
    for (const auto& [i, digest] : j[rk].items()) {
      if (i.empty() || i.size() > 9 || i.find_first_not_of("0123456789") != std::string::npos || std::stoull(i) >= n ||
          !digest.is_string())
        return parse_error("\"" + rk + "\" holds an index out of range or a digest that is not a string");
    }
    *again = j[rk];
  }
  return e;
}

sandbox::RunSpec truth_spec(const Task& t, const ExpectedOptions& o) {
  sandbox::RunSpec s;
  s.argv = {"python3", "-I", "/tmp/truth.py"};
  s.files["truth.py"] = std::string(kEvalPlusPython) + kTruthRunner;
  s.files["task.json"] = t.source;
  s.files["rules.json"] =
      nlohmann::json{{"inputs", input_rule(t)}, {"oracle", special_oracle(t)}, {"mbpp", t.dataset == Dataset::kMbpp}}.dump();
  s.limits.wall_seconds = o.task_timeout_seconds;
  s.limits.cpu_seconds = o.task_timeout_seconds + 1;
  s.limits.address_space_bytes = o.memory_bytes;
  s.limits.memory_bytes = o.memory_bytes;
  s.limits.max_processes = 2;  // one process: without a cgroup, each may use half the memory (RLIMIT_AS)
  s.limits.output_bytes = 256ll << 20;
  s.limits.tmp_bytes = 256ll << 20;
  return s;
}

// The cached entries of `path` for `tasks`; a damaged file is reported through `note` and yields none.
ExpectedMap read_cache(const std::string& path, const std::string& key, const std::vector<const Task*>& tasks,
                       const std::function<void(const std::string&)>& note) {
  ExpectedMap out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  auto damaged = [&](const std::string& why) {
    note("eval: damaged expected-output cache " + path + ": " + why + "; rebuilding it");
    return ExpectedMap();
  };
  auto text = read_text_file(path, int64_t{1} << 34);
  if (!text.ok()) return damaged(text.status().message());
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return damaged("not JSON");
  const auto text_of = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : ""; };
  if (text_of("format") != kCacheFormat) return damaged("not of format " + std::string(kCacheFormat));
  if (text_of("benchmark") != key) return damaged("written for another benchmark file");
  if (!j.contains("tasks") || !j["tasks"].is_object()) return damaged("no \"tasks\" object");
  for (const Task* t : tasks) {
    if (!j["tasks"].contains(t->task_id)) continue;
    auto e = from_json(j["tasks"][t->task_id], *t);
    if (!e.ok()) return damaged(t->task_id + ": " + e.status().message());
    out[t->task_id] = std::move(*e);
  }
  return out;
}

}  // namespace

Result<std::string> benchmark_key(const std::string& path) {
  DC_ASSIGN_OR_RETURN(std::string bytes, read_text_file(path, int64_t{1} << 34));
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return std::to_string(bytes.size()) + "-" + buf;
}

Result<ExpectedMap> expected_outputs(const std::vector<Task>& tasks, const std::string& benchmark_path,
                                     const ExpectedOptions& o, const std::function<void(const std::string&)>& note) {
  std::vector<const Task*> wanted;
  for (const Task& t : tasks)
    if (t.has_inputs) wanted.push_back(&t);
  if (wanted.empty()) return ExpectedMap();
  DC_ASSIGN_OR_RETURN(std::string key, benchmark_key(benchmark_path));
  const std::string path = (std::filesystem::path(o.cache_dir) / (key + ".json")).string();
  ExpectedMap have = read_cache(path, key, wanted, note);
  std::vector<const Task*> todo;
  std::vector<sandbox::RunSpec> specs;
  for (const Task* t : wanted)
    if (!have.count(t->task_id)) todo.push_back(t), specs.push_back(truth_spec(*t, o));
  if (todo.empty()) return have;
  note("eval: computing the expected outputs of " + std::to_string(todo.size()) +
       " tasks (their canonical solutions, in the sandbox); cached in " + path);
  Status first = Status::ok_status();
  sandbox::run_all(specs, o.workers, [&](size_t i, const Result<sandbox::RunResult>& r) {
    if (!first.ok()) return;
    const Task& t = *todo[i];
    if (!r.ok()) {
      first = r.status().with_context(t.task_id);
      return;
    }
    const std::string& err = r->stderr_data;
    const size_t at = err.rfind("\nDC_TRUTH ");
    const std::string why = at != std::string::npos ? err.substr(at + 10, err.find('\n', at + 10) - at - 10) : "";
    if (!r->ok() && why.rfind("MalformedInput: ", 0) == 0)
      first = parse_error(benchmark_path + ": " + t.task_id + ": " + why.substr(16));
    else if (!r->ok())
      first = failed_precondition(
          t.task_id + ": the canonical solution failed on its own inputs: " +
          (!why.empty()                           ? why
           : r->limit != sandbox::LimitHit::kNone ? std::string(sandbox::limit_hit_name(r->limit)) + " limit"
                                                  : "exit code " + std::to_string(r->exit_code)));
    else if (auto e = from_json(nlohmann::json::parse(r->stdout_data, nullptr, false), t); !e.ok())
      first = e.status().with_context(t.task_id + ": the truth runner's report");
    else
      have[t.task_id] = std::move(*e);
  });
  DC_RETURN_IF_ERROR(first);
  // Rewrite the cache with everything it held for these tasks and what was computed.
  nlohmann::json j = {{"format", kCacheFormat}, {"benchmark", key}, {"tasks", nlohmann::json::object()}};
  for (const auto& [id, e] : have) j["tasks"][id] = to_json(e);
  std::error_code ec;
  std::filesystem::create_directories(o.cache_dir, ec);
  const std::string text = j.dump();
  Status w = write_file_atomically(path, [&](const ByteSink& sink) { return sink(text.data(), text.size()); });
  if (!w.ok()) note("eval: could not write the expected-output cache: " + w.message());
  return have;
}

Plan make_plan(const Task& task, const Expected& e, double min_time_limit, double factor) {
  Plan p;
  nlohmann::json j = {{"oracle", special_oracle(task)}, {"input_rule", input_rule(task)}, {"expected", e.blob},
                      {"base_skip", e.base_skip}, {"plus_skip", e.plus_skip},
                      {"base_recompute", e.base_recompute}, {"plus_recompute", e.plus_recompute}};
  p.wall_seconds = 2;
  for (auto [col, times] : {std::pair{"base", &e.base_time}, std::pair{"plus", &e.plus_time}}) {
    std::vector<double> limits;
    double sum = 0;
    for (double t : *times) limits.push_back(std::max(min_time_limit, factor * t)), sum += limits.back();
    j[std::string(col) + "_limits"] = limits;
    p.wall_seconds += std::min(60.0, sum) + 1;
  }
  p.json = j.dump();
  return p;
}

}  // namespace dc::eval
