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
  nlohmann::json j = {{"task_id", r.task_id},   {"sample", r.sample},   {"passed", r.passed},
                      {"passed_base", r.passed}, {"failure", failure_name(r.failure)}, {"detail", r.detail}};
  if (r.has_plus) {
    j["passed_plus"] = r.passed_plus;
    j["failure_plus"] = failure_name(r.failure_plus);
    j["detail_plus"] = r.detail_plus;
  }
  j["wall_ms"] = std::round(r.wall_ms * 10) / 10;
  j["tokens"] = r.tokens;
  j["completion"] = r.completion;
  return j;
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
  if (j.contains("passed_plus")) {
    if (!j["passed_plus"].is_boolean() || !j.contains("failure_plus") || !j["failure_plus"].is_string())
      return parse_error("a record with passed_plus needs a boolean passed_plus and a string failure_plus");
    r.has_plus = true;
    r.passed_plus = j["passed_plus"].get<bool>();
    DC_ASSIGN_OR_RETURN(r.failure_plus, parse_failure(j["failure_plus"].get<std::string>()));
    if (j.contains("detail_plus") && j["detail_plus"].is_string()) r.detail_plus = j["detail_plus"].get<std::string>();
  }
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
  std::lock_guard<std::mutex> lock(mu_);
  ++done_, ++new_done_;
  passed_ += r.passed;
  if (quiet_) return;
  const double t = now_seconds() - t0_;
  if (done_ < total_ && t - last_print_ < 0.5) return;
  last_print_ = t;
  const double eta = new_done_ > 0 ? t / new_done_ * (total_ - done_) : 0;
  // One line per update when stderr is not a terminal (logs), redrawn in place when it is.
  std::fprintf(stderr, "%seval%s%s: %lld/%lld samples, pass %.3f so far", isatty(2) ? "\r" : "",
               label_.empty() ? "" : " ", label_.c_str(), static_cast<long long>(done_),
               static_cast<long long>(total_), new_done_ ? static_cast<double>(passed_) / new_done_ : 0.0);
  if (tokens_ > 0 && gen_seconds_ > 0) std::fprintf(stderr, ", %.1f tok/s", tokens_ / gen_seconds_);
  std::fprintf(stderr, ", %.0f s, ETA %.0f s%s", t, eta, isatty(2) ? "   " : "\n");
  std::fflush(stderr);
}

void Progress::add_generation(int64_t tokens, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ += tokens, gen_seconds_ += seconds;
}

void Progress::skip(int64_t samples) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += samples;
}

void Progress::set_label(const std::string& label) {
  std::lock_guard<std::mutex> lock(mu_);
  label_ = label;
  last_print_ = -1;  // the next sample prints: each label shows at least once
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!quiet_ && new_done_ > 0 && isatty(2)) std::fprintf(stderr, "\n");
}

namespace {

// check_samples over samples [begin, end).
Status check_range(const std::vector<Sample>& all, size_t begin, size_t end,
                   const std::map<std::string, const Task*>& tasks, const CheckOptions& options, int workers,
                   const std::function<Status(const SampleRecord&)>& on_record, const PlanMap& plans) {
  const Sample* samples = all.data() + begin;
  std::vector<sandbox::RunSpec> specs;
  std::vector<std::string> nonces;
  std::vector<bool> differential;
  specs.reserve(end - begin);
  for (size_t k = begin; k < end; ++k) {
    const Sample& s = all[k];
    auto it = tasks.find(s.task_id);
    if (it == tasks.end()) return invalid_argument("unknown task_id " + s.task_id);
    nonces.push_back(make_nonce());
    differential.push_back(it->second->has_inputs);
    if (!it->second->has_inputs) {
      specs.push_back(check_spec(*it->second, s.program, options, nonces.back()));
      continue;
    }
    auto plan = plans.find(s.task_id);
    if (plan == plans.end()) return invalid_argument("no expected outputs for " + s.task_id);
    specs.push_back(inputs_check_spec(*it->second, s.program, plan->second.json, plan->second.wall_seconds, options,
                                      nonces.back()));
  }
  Status first_error = Status::ok_status();
  sandbox::run_all(specs, workers, [&](size_t i, const Result<sandbox::RunResult>& r) {
    if (!first_error.ok()) return;
    if (!r.ok()) {
      first_error = r.status().with_context(samples[i].task_id);
      return;
    }
    ColumnVerdicts cv;
    if (differential[i]) cv = classify_columns(*r, nonces[i]);
    else cv.base = classify(*r, nonces[i]);
    const Verdict& v = cv.base;
    SampleRecord rec;
    rec.has_plus = differential[i];
    rec.passed_plus = cv.plus.passed;
    rec.failure_plus = cv.plus.failure;
    rec.detail_plus = cv.plus.detail;
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

}  // namespace

Status check_samples(const std::vector<Sample>& samples, const std::map<std::string, const Task*>& tasks,
                     const CheckOptions& options, int workers,
                     const std::function<Status(const SampleRecord&)>& on_record, const PlanMap& plans) {
  // A spec holds its sample's files (for HumanEval+ the task's inputs and expected outputs, up to megabytes), so
  // they are made a chunk at a time: memory stays bounded however many samples a run checks.
  const size_t chunk = std::max<size_t>(64, static_cast<size_t>(workers) * 8);
  for (size_t begin = 0; begin < samples.size(); begin += chunk)
    DC_RETURN_IF_ERROR(check_range(samples, begin, std::min(samples.size(), begin + chunk), tasks, options, workers,
                                   on_record, plans));
  return Status::ok_status();
}

namespace {

// One column's passed count, failure kinds and pass@k from (task → (n, c)) and the records' kinds.
void fill_column(Column& col, const std::vector<Task>& tasks, const std::map<std::string, std::pair<int64_t, int64_t>>& nc,
                 int64_t n_tasks, int64_t min_samples) {
  for (auto it = col.failures.begin(); it != col.failures.end();) it = it->second == 0 ? col.failures.erase(it) : ++it;
  for (int k : {1, 10, 100}) {
    if (k > min_samples || n_tasks == 0) continue;
    double sum = 0;
    for (const auto& t : tasks) {
      auto it = nc.find(t.task_id);
      if (it != nc.end()) sum += pass_at_k(it->second.first, it->second.second, k);
    }
    col.pass_at_k[k] = sum / static_cast<double>(n_tasks);
  }
}

nlohmann::json column_json(const Column& c) {
  nlohmann::json pk = nlohmann::json::object();
  for (const auto& [k, v] : c.pass_at_k) pk["pass@" + std::to_string(k)] = v;
  return {{"pass_at_k", pk}, {"passed", c.passed}, {"failures", c.failures}};
}

}  // namespace

Summary summarize(const std::vector<Task>& tasks, const std::vector<SampleRecord>& records) {
  Summary s;
  std::map<std::string, std::pair<int64_t, int64_t>> base, plus;  // task → (n, c)
  for (const auto& r : records) {
    auto& b = base[r.task_id];
    ++b.first;
    b.second += r.passed;
    ++s.samples;
    s.base.passed += r.passed;
    s.base.failures[failure_name(r.failure)] += r.passed ? 0 : 1;
    auto& p = plus[r.task_id];
    ++p.first;
    p.second += r.passed_plus;
    s.has_plus |= r.has_plus;
    s.plus.passed += r.passed_plus;
    s.plus.failures[failure_name(r.failure_plus)] += r.passed_plus ? 0 : 1;
  }
  s.min_samples = -1;
  for (const auto& t : tasks) {
    auto it = base.find(t.task_id);
    if (it == base.end()) {
      s.missing.push_back(t.task_id);
      continue;
    }
    ++s.tasks;
    s.min_samples = s.min_samples < 0 ? it->second.first : std::min(s.min_samples, it->second.first);
  }
  if (s.min_samples < 0) s.min_samples = 0;
  fill_column(s.base, tasks, base, s.tasks, s.min_samples);
  fill_column(s.plus, tasks, plus, s.tasks, s.min_samples);
  if (!s.has_plus) s.plus = Column();
  return s;
}

nlohmann::json summary_json(const Summary& s, bool columns) {
  nlohmann::json base = column_json(s.base);
  nlohmann::json j = {{"tasks", s.tasks},       {"samples", s.samples},   {"passed", s.base.passed},
                      {"samples_per_task", s.min_samples}, {"pass_at_k", base["pass_at_k"]},
                      {"failures", s.base.failures}, {"missing_tasks", s.missing.size()}};
  if (columns) j["base"] = base;
  if (columns && s.has_plus) j["plus"] = column_json(s.plus);
  return j;
}

std::string summary_table(const Summary& s, bool columns) {
  const bool two = columns && s.has_plus;
  std::ostringstream o;
  char buf[160];
  const auto row = [&](const std::string& name, const std::string& b, const std::string& p) {
    o << "| " << name << " | " << b << (two ? " | " + p : "") << " |\n";
  };
  o << (two ? "| metric | base | plus |\n|---|---|---|\n" : "| metric | value |\n|---|---|\n");
  const std::string per = std::to_string(s.samples) + " (" + std::to_string(s.min_samples) + " per task)";
  row("tasks", std::to_string(s.tasks), std::to_string(s.tasks));
  row("samples", per, per);
  row("passed samples", std::to_string(s.base.passed), std::to_string(s.plus.passed));
  for (const auto& [k, v] : s.base.pass_at_k) {
    std::snprintf(buf, sizeof(buf), "%.4f", v);
    std::string p = "";
    if (two) {
      char pb[32];
      std::snprintf(pb, sizeof(pb), "%.4f", s.plus.pass_at_k.at(k));
      p = pb;
    }
    row("pass@" + std::to_string(k), buf, p);
  }
  std::set<std::string> kinds;
  for (const auto& [kind, n] : s.base.failures) kinds.insert(kind);
  if (two)
    for (const auto& [kind, n] : s.plus.failures) kinds.insert(kind);
  const auto count = [](const Column& c, const std::string& kind) {
    auto it = c.failures.find(kind);
    return std::to_string(it == c.failures.end() ? 0 : it->second);
  };
  for (const auto& kind : kinds) row("failed: " + kind, count(s.base, kind), count(s.plus, kind));
  if (!s.missing.empty()) row("tasks without samples", std::to_string(s.missing.size()), std::to_string(s.missing.size()));
  return o.str();
}

}  // namespace dc::eval
