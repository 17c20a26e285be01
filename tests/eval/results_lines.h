// The sample lines of an eval results file (the settings line skipped) by (task_id, sample), for the eval tests.
#pragma once

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace dc::testing {

inline std::map<std::pair<std::string, int>, nlohmann::json> results_lines(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::map<std::pair<std::string, int>, nlohmann::json> out;
  std::getline(in, line);  // settings
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    out[{j["task_id"].get<std::string>(), j["sample"].get<int>()}] = j;
  }
  return out;
}

}  // namespace dc::testing
