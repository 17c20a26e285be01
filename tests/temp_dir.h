// The one scratch directory of the tests: a fresh, uniquely named directory under the system temp dir
// (mkdtemp), removed with everything in it when the object goes out of scope, also after a failed
// assertion, so that test runs leave nothing behind in /tmp. Every test that writes files uses it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace dc::test {

class TempDir {
 public:
  // The directory is named dc_TAG_XXXXXX, so that a leftover (a killed run) says which test made it.
  explicit TempDir(const std::string& tag = "test") {
    std::string pattern = (std::filesystem::temp_directory_path() / ("dc_" + tag + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    if (path_.empty()) return;  // moved from
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir& operator=(TempDir&&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

  // The names of the entries of the directory, sorted.
  std::vector<std::string> list() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

}  // namespace dc::test
