#include "eval/suite.h"

#include <cstdio>
#include <sstream>

namespace dc::eval {

const std::vector<SuiteColumn>& paper_columns() {
  static const std::vector<SuiteColumn> kColumns = {{"HumanEval", "humaneval", "humaneval", false},
                                                    {"HumanEval+", "humaneval+", "humanevalplus", true},
                                                    {"MBPP", "mbpp", "mbpp", false},
                                                    {"MBPP+", "mbpp+", "mbppplus", true}};
  return kColumns;
}

std::optional<double> suite_pass_at_1(const SuiteResult& r) {
  if (!r.ran) return std::nullopt;
  if (r.column.plus && !r.summary.has_plus) return std::nullopt;
  const Column& c = r.column.plus ? r.summary.plus : r.summary.base;
  auto it = c.pass_at_k.find(1);
  if (it == c.pass_at_k.end()) return std::nullopt;
  return it->second;
}

std::optional<double> suite_mean(const std::vector<SuiteResult>& results) {
  double sum = 0;
  int n = 0;
  for (const auto& r : results)
    if (auto v = suite_pass_at_1(r)) sum += *v, ++n;
  if (n == 0) return std::nullopt;
  return sum / n;
}

nlohmann::json suite_json(const std::vector<SuiteResult>& results, const nlohmann::json& about) {
  nlohmann::json row = nlohmann::json::object(), not_run = nlohmann::json::object(), benchmarks = nlohmann::json::object();
  nlohmann::json in_mean = nlohmann::json::array();
  for (const auto& r : results) {
    auto v = suite_pass_at_1(r);
    row[r.column.column] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
    if (v) in_mean.push_back(r.column.column);
    if (!r.ran) {
      not_run[r.column.column] = r.not_run;
      continue;
    }
    nlohmann::json b = summary_json(r.summary, r.columns);
    b["results"] = r.results_path;
    b["column"] = r.column.plus ? "plus" : "base";
    if (r.model) {
      b["generated"] = r.generated, b["reused"] = r.reused;
      if (r.reused > 0) b["reused_from"] = r.reused_from;
    }
    benchmarks[r.column.benchmark] = b;
  }
  auto mean = suite_mean(results);
  row["mean"] = mean ? nlohmann::json(*mean) : nlohmann::json(nullptr);
  nlohmann::json j = {{"suite", "paper"}, {"row", row}, {"columns_in_mean", in_mean}, {"not_run", not_run},
                      {"benchmarks", benchmarks}};
  for (const auto& [k, v] : about.items()) j[k] = v;
  return j;
}

std::string suite_percent(std::optional<double> v) {
  if (!v) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", *v * 100);
  return buf;
}

std::string suite_table(const std::vector<SuiteResult>& results, const std::string& row_name) {
  std::ostringstream o;
  o << "| pass@1 (%) |";
  for (const auto& r : results) o << " " << r.column.column << " |";
  int n_mean = 0;
  for (const auto& r : results) n_mean += suite_pass_at_1(r).has_value();
  o << " mean" << (n_mean < static_cast<int>(results.size()) ? " (" + std::to_string(n_mean) + " columns)" : "")
    << " |\n|---|";
  for (size_t i = 0; i <= results.size(); ++i) o << "---|";
  o << "\n| " << row_name << " |";
  for (const auto& r : results) o << " " << suite_percent(suite_pass_at_1(r)) << " |";
  o << " " << suite_percent(suite_mean(results)) << " |\n";
  for (const auto& r : results) {
    if (!r.ran) {
      o << r.column.column << ": not run: " << r.not_run << "\n";
      continue;
    }
    o << r.column.column << ": " << r.column.benchmark << " (" << (r.column.plus ? "plus" : "base") << " column), "
      << r.summary.tasks << " tasks, " << r.summary.samples << " samples";
    if (!r.summary.missing.empty()) o << ", " << r.summary.missing.size() << " tasks without samples";
    if (r.reused > 0) o << ", " << r.reused << " completions decoded once for " << r.reused_from << " (the same prompts)";
    o << "; results " << r.results_path << "\n";
  }
  return o.str();
}

}  // namespace dc::eval
