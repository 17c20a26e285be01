// Access to the reference fixtures written by tests/reference/make_fixtures.py (ctest fixture
// `reference_fixtures`): checkpoint directories, forward.json / generate.json and raw f32 logits.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dc::testing {

inline std::string fixtures_dir() { return DC_FIXTURES_DIR; }

// The manifest, or a test failure when the fixtures have not been written.
inline nlohmann::json load_manifest() {
  const std::filesystem::path dir = fixtures_dir();
  if (!std::filesystem::exists(dir / ".complete")) {
    ADD_FAILURE() << "reference fixtures missing in " << dir << ": run `ctest -R reference_fixtures` first";
    return nlohmann::json::object({{"models", nlohmann::json::array()}});
  }
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

inline std::vector<float> load_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

// Flattens a [B][L] JSON array of integers.
template <typename T>
std::vector<T> flatten(const nlohmann::json& rows) {
  std::vector<T> out;
  for (const auto& row : rows)
    for (const auto& v : row) out.push_back(v.get<T>());
  return out;
}

}  // namespace dc::testing
