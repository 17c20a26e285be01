#include "eval/report.h"

#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace dc::eval {

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

constexpr const char* kStyle =
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.3em .7em;text-align:right}"
    "th:first-child,td:first-child{text-align:left}"
    ".grid{display:flex;flex-wrap:wrap;gap:2px;margin:.3em 0 1em}"
    ".c{display:inline-block;min-width:2.6em;padding:2px 0;font-size:11px;text-align:center;border-radius:2px}"
    ".all{background:#5cb85c;color:#fff}.none{background:#d9534f;color:#fff}.some{background:#f0ad4e}"
    ".missing{background:#ddd}.note{color:#666}.kv td{text-align:left}";

// One task's samples in one column.
struct Cell {
  int64_t samples = 0, passed = 0;
  std::map<std::string, int64_t> failures;  // kind → samples
};

// The text after the task id's last '/' ("HumanEval/7" → "7"), the cell's label.
std::string short_id(const std::string& id) {
  const size_t slash = id.rfind('/');
  return slash == std::string::npos ? id : id.substr(slash + 1);
}

void write_grid(std::ostringstream& o, const SuiteResult& r, bool plus) {
  std::map<std::string, Cell> cells;
  for (const auto& rec : r.records) {
    Cell& c = cells[rec.task_id];
    const bool passed = plus ? rec.passed_plus : rec.passed;
    ++c.samples;
    c.passed += passed;
    if (!passed) ++c.failures[failure_name(plus ? rec.failure_plus : rec.failure)];
  }
  o << "<div class=\"grid\">";
  for (const auto& id : r.task_ids) {
    auto it = cells.find(id);
    const Cell c = it == cells.end() ? Cell() : it->second;
    const char* cls = c.samples == 0 ? "missing" : c.passed == c.samples ? "all" : c.passed == 0 ? "none" : "some";
    std::string title = id + " " + (plus ? "plus" : "base") + ": " + std::to_string(c.passed) + "/" +
                        std::to_string(c.samples) + " passed";
    for (const auto& [kind, n] : c.failures) title += ", " + kind + " " + std::to_string(n);
    o << "<span class=\"c " << cls << "\" title=\"" << html_escape(title) << "\">" << html_escape(short_id(id))
      << "</span>";
  }
  o << "</div>\n";
}

void write_failures(std::ostringstream& o, const SuiteResult& r) {
  const bool two = r.summary.has_plus;
  std::set<std::string> kinds;
  for (const auto& [k, n] : r.summary.base.failures) kinds.insert(k);
  for (const auto& [k, n] : r.summary.plus.failures) kinds.insert(k);
  o << "<table><tr><th>failure kind</th><th>base</th>" << (two ? "<th>plus</th>" : "") << "</tr>";
  const auto count = [](const Column& c, const std::string& k) {
    auto it = c.failures.find(k);
    return it == c.failures.end() ? int64_t{0} : it->second;
  };
  for (const auto& k : kinds) {
    o << "<tr><td>" << html_escape(k) << "</td><td>" << count(r.summary.base, k) << "</td>";
    if (two) o << "<td>" << count(r.summary.plus, k) << "</td>";
    o << "</tr>";
  }
  o << "<tr><td>passed</td><td>" << r.summary.base.passed << "</td>";
  if (two) o << "<td>" << r.summary.plus.passed << "</td>";
  o << "</tr></table>\n";
}

}  // namespace

std::string suite_report_html(const std::vector<SuiteResult>& results, const std::string& title,
                              const nlohmann::json& about) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << html_escape(title)
    << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n<h1>" << html_escape(title) << "</h1>\n";
  o << "<table class=\"kv\">";
  for (const auto& [k, v] : about.items())
    o << "<tr><td>" << html_escape(k) << "</td><td>" << html_escape(v.is_string() ? v.get<std::string>() : v.dump())
      << "</td></tr>";
  o << "</table>\n<h2>pass@1 (%)</h2>\n<table><tr><th></th>";
  for (const auto& r : results) o << "<th>" << html_escape(r.column.column) << "</th>";
  o << "<th>mean</th></tr><tr><td>this run</td>";
  for (const auto& r : results) o << "<td>" << suite_percent(suite_pass_at_1(r)) << "</td>";
  o << "<td>" << suite_percent(suite_mean(results)) << "</td></tr></table>\n";
  o << "<p class=\"note\">Each grid has a cell per task: <span class=\"c all\">all</span> every sample passed, "
       "<span class=\"c some\">some</span> some did, <span class=\"c none\">none</span> none did, "
       "<span class=\"c missing\">n/a</span> no sample; a cell's tooltip names the task and its failure kinds.</p>\n";
  for (const auto& r : results)
    if (!r.ran) o << "<p class=\"note\">" << html_escape(r.column.column) << ": not run: " << html_escape(r.not_run) << "</p>\n";
  for (const auto& r : results) {
    if (!r.ran) continue;
    o << "<h2>" << html_escape(r.column.benchmark) << "</h2>\n<p class=\"note\">" << r.summary.tasks << " tasks, "
      << r.summary.samples << " samples; results " << html_escape(r.results_path) << "</p>\n";
    o << "<h3>base</h3>\n";
    write_grid(o, r, false);
    if (r.summary.has_plus) {
      o << "<h3>plus</h3>\n";
      write_grid(o, r, true);
    }
    write_failures(o, r);
  }
  o << "</body>\n</html>\n";
  return o.str();
}

}  // namespace dc::eval
