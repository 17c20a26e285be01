// The HTML report of `eval --suite paper`: one self-contained page (inline CSS; no script, image, font or link
// to fetch) a person opens in a browser.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/suite.h"

namespace dc::eval {

// The page: `title`, the settings in `about` (key: value), the paper's row (suite_table's numbers), then per
// benchmark that ran a grid with one cell per task and column (base, and plus where the benchmark has it): green
// when every sample passed, red when none did, amber in between, grey without samples; the cell shows the task's
// number and its title names the task id, the samples passed and the failure kinds. Then each column's failure
// kinds with their counts. Every text from the results (task ids, details) is HTML-escaped.
std::string suite_report_html(const std::vector<SuiteResult>& results, const std::string& title,
                              const nlohmann::json& about);

// `text` with & < > " ' as character references.
std::string html_escape(const std::string& text);

}  // namespace dc::eval
