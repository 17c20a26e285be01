#include "eval/run.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <sstream>

#include "eval/pass_at_k.h"
#include "sandbox/pool.h"

namespace dc::eval {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<Failure> parse_failure(const std::string& s) {
  for (Failure f : {Failure::kNone, Failure::kAssertion, Failure::kException, Failure::kTimeout, Failure::kSyntax,
                    Failure::kLimit})
    if (s == failure_name(f)) return f;
  return parse_error("unknown failure kind \"" + s + "\"");
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

nlohmann::json to_json(const SampleRecord& r) {
  return {{"task_id", r.task_id},   {"sample", r.sample},   {"passed", r.passed},
          {"failure", failure_name(r.failure)}, {"detail", r.detail}, {"wall_ms", std::round(r.wall_ms * 10) / 10},
          {"tokens", r.tokens},     {"completion", r.completion}};
}

Result<SampleRecord> record_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("task_id") || !j["task_id"].is_string() || !j.contains("sample") ||
      !j["sample"].is_number_integer() || !j.contains("passed") || !j["passed"].is_boolean() ||
      !j.contains("failure") || !j["failure"].is_string())
    return parse_error("a record needs task_id, sample, passed and failure");
  SampleRecord r;
  r.task_id = j["task_id"].get<std::string>();
  if (!j["sample"].is_number_unsigned() || j["sample"].get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))
    return parse_error("sample must be an integer in [0, 2147483647]");
  r.sample = static_cast<int>(j["sample"].get<uint64_t>());
  r.passed = j["passed"].get<bool>();
  DC_ASSIGN_OR_RETURN(r.failure, parse_failure(j["failure"].get<std::string>()));
  if (j.contains("detail") && j["detail"].is_string()) r.detail = j["detail"].get<std::string>();
  if (j.contains("wall_ms") && j["wall_ms"].is_number()) r.wall_ms = j["wall_ms"].get<double>();
  if (j.contains("tokens") && j["tokens"].is_number_integer()) r.tokens = j["tokens"].get<int64_t>();
  if (j.contains("completion") && j["completion"].is_string()) r.completion = j["completion"].get<std::string>();
  return r;
}

Result<ResultsFile> ResultsFile::open(const std::string& path, const nlohmann::json& settings, bool resume,
                                      bool overwrite, const std::map<std::string, int>& samples_per_task) {
  ResultsFile rf;
  rf.path_ = path;
  const bool exists = access(path.c_str(), F_OK) == 0;
  if (exists && resume) {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Keep whole lines only: a run killed mid-write leaves a partial last line.
    size_t keep = text.rfind('\n');
    keep = keep == std::string::npos ? 0 : keep + 1;
    std::istringstream lines(text.substr(0, keep));
    std::string line;
    size_t no = 0;
    while (std::getline(lines, line)) {
      ++no;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      const std::string where = path + " line " + std::to_string(no);
      if (j.is_discarded()) return parse_error(where + ": not JSON");
      if (no == 1) {
        if (!j.is_object() || !j.contains("settings")) return parse_error(where + ": not a results file (no settings line)");
        for (const auto& [k, v] : settings.items()) {
          if (!j["settings"].contains(k) || j["settings"][k] != v)
            return invalid_argument("--resume: " + path + " was written with " + k + " = " +
                                    (j["settings"].contains(k) ? dump(j["settings"][k]) : "(unset)") +
                                    ", this run has " + dump(v) + "; use the same settings or a new --out");
        }
        continue;
      }
      auto r = record_from_json(j);
      if (!r.ok()) return r.status().with_context(where);
      auto n = samples_per_task.find(r->task_id);
      if (n == samples_per_task.end())
        return invalid_argument(where + ": task_id " + r->task_id.substr(0, 200) + " is not a task of this run");
      if (r->sample >= n->second)
        return invalid_argument(where + ": sample " + std::to_string(r->sample) + " of " + r->task_id +
                                " is out of range (this run checks " + std::to_string(n->second) + " per task)");
      if (rf.done_.insert({r->task_id, r->sample}).second) rf.records_.push_back(std::move(*r));
    }
    if (no == 0) return parse_error(path + ": empty results file");
    if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0) return io_error("cannot truncate " + path);
    rf.f_ = std::fopen(path.c_str(), "ab");
    if (!rf.f_) return io_error("cannot append to " + path);
    return rf;
  }
  if (exists && !overwrite)
    return invalid_argument(path + " exists: pass --resume to continue that run, or --force to overwrite it");
  rf.f_ = std::fopen(path.c_str(), "wb");
  if (!rf.f_) return io_error("cannot write " + path);
  std::string head = dump(nlohmann::json{{"settings", settings}}) + "\n";
  if (std::fwrite(head.data(), 1, head.size(), rf.f_) != head.size() || std::fflush(rf.f_) != 0)
    return io_error("cannot write " + path);
  return rf;
}

ResultsFile::~ResultsFile() {
  if (f_) std::fclose(f_);
}

Status ResultsFile::append(const SampleRecord& r) {
  std::string line = dump(to_json(r)) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    return io_error("cannot append to " + path_);
  done_.insert({r.task_id, r.sample});
  records_.push_back(r);
  return Status::ok_status();
}

Progress::Progress(int64_t total_samples, int64_t already_done, bool quiet)
    : total_(total_samples), done_(already_done), quiet_(quiet), t0_(now_seconds()) {}

void Progress::add(const SampleRecord& r) {
  ++done_, ++new_done_;
  passed_ += r.passed;
  if (quiet_) return;
  const double t = now_seconds() - t0_;
  if (done_ < total_ && t - last_print_ < 0.5) return;
  last_print_ = t;
  const double eta = new_done_ > 0 ? t / new_done_ * (total_ - done_) : 0;
  // One line per update when stderr is not a terminal (logs), redrawn in place when it is.
  std::fprintf(stderr, "%seval: %lld/%lld samples, pass %.3f so far", isatty(2) ? "\r" : "", static_cast<long long>(done_),
               static_cast<long long>(total_), new_done_ ? static_cast<double>(passed_) / new_done_ : 0.0);
  if (tokens_ > 0 && gen_seconds_ > 0) std::fprintf(stderr, ", %.1f tok/s", tokens_ / gen_seconds_);
  std::fprintf(stderr, ", %.0f s, ETA %.0f s%s", t, eta, isatty(2) ? "   " : "\n");
  std::fflush(stderr);
}

void Progress::finish() {
  if (!quiet_ && new_done_ > 0 && isatty(2)) std::fprintf(stderr, "\n");
}

Status check_samples(const std::vector<Sample>& samples, const std::map<std::string, const Task*>& tasks,
                     const CheckOptions& options, int workers,
                     const std::function<Status(const SampleRecord&)>& on_record) {
  std::vector<sandbox::RunSpec> specs;
  std::vector<std::string> nonces;
  specs.reserve(samples.size());
  for (const auto& s : samples) {
    auto it = tasks.find(s.task_id);
    if (it == tasks.end()) return invalid_argument("unknown task_id " + s.task_id);
    nonces.push_back(make_nonce());
    specs.push_back(check_spec(*it->second, s.program, options, nonces.back()));
  }
  Status first_error = Status::ok_status();
  sandbox::run_all(specs, workers, [&](size_t i, const Result<sandbox::RunResult>& r) {
    if (!first_error.ok()) return;
    if (!r.ok()) {
      first_error = r.status().with_context(samples[i].task_id);
      return;
    }
    Verdict v = classify(*r, nonces[i]);
    SampleRecord rec;
    rec.task_id = samples[i].task_id;
    rec.sample = samples[i].sample;
    rec.completion = samples[i].completion;
    rec.passed = v.passed;
    rec.failure = v.failure;
    rec.detail = v.detail;
    rec.wall_ms = r->wall_seconds * 1000;
    rec.tokens = samples[i].tokens;
    Status s = on_record(rec);
    if (!s.ok()) first_error = s;
  });
  return first_error;
}

Summary summarize(const std::vector<Task>& tasks, const std::vector<SampleRecord>& records) {
  Summary s;
  std::map<std::string, std::pair<int64_t, int64_t>> nc;  // task → (n, c)
  for (const auto& r : records) {
    auto& p = nc[r.task_id];
    ++p.first;
    p.second += r.passed;
    ++s.samples;
    s.passed += r.passed;
    s.failures[failure_name(r.failure)] += r.passed ? 0 : 1;
  }
  for (auto it = s.failures.begin(); it != s.failures.end();) it = it->second == 0 ? s.failures.erase(it) : ++it;
  s.min_samples = -1;
  for (const auto& t : tasks) {
    auto it = nc.find(t.task_id);
    if (it == nc.end()) {
      s.missing.push_back(t.task_id);
      continue;
    }
    ++s.tasks;
    s.min_samples = s.min_samples < 0 ? it->second.first : std::min(s.min_samples, it->second.first);
  }
  if (s.min_samples < 0) s.min_samples = 0;
  for (int k : {1, 10, 100}) {
    if (k > s.min_samples || s.tasks == 0) continue;
    double sum = 0;
    for (const auto& t : tasks) {
      auto it = nc.find(t.task_id);
      if (it != nc.end()) sum += pass_at_k(it->second.first, it->second.second, k);
    }
    s.pass_at_k[k] = sum / static_cast<double>(s.tasks);
  }
  return s;
}

nlohmann::json summary_json(const Summary& s) {
  nlohmann::json pk = nlohmann::json::object();
  for (const auto& [k, v] : s.pass_at_k) pk["pass@" + std::to_string(k)] = v;
  return {{"tasks", s.tasks},       {"samples", s.samples},   {"passed", s.passed},
          {"samples_per_task", s.min_samples}, {"pass_at_k", pk}, {"failures", s.failures},
          {"missing_tasks", s.missing.size()}};
}

std::string summary_table(const Summary& s) {
  std::ostringstream o;
  char buf[128];
  o << "| metric | value |\n|---|---|\n";
  o << "| tasks | " << s.tasks << " |\n| samples | " << s.samples << " (" << s.min_samples << " per task) |\n";
  o << "| passed samples | " << s.passed << " |\n";
  for (const auto& [k, v] : s.pass_at_k) {
    std::snprintf(buf, sizeof(buf), "| pass@%d | %.4f |\n", k, v);
    o << buf;
  }
  for (const auto& [kind, n] : s.failures) o << "| failed: " << kind << " | " << n << " |\n";
  if (!s.missing.empty()) o << "| tasks without samples | " << s.missing.size() << " |\n";
  return o.str();
}

}  // namespace dc::eval
