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
// The tiny checkpoint with the real Qwen2 vocabulary (text in, text out), and a small-vocabulary one.
inline std::string vocab_model() { return fixtures_dir() + "/tiny-vocab"; }
inline std::string small_model() { return fixtures_dir() + "/tiny-gqa1"; }

// The manifest, or a test failure when the fixtures have not been written. (The JSON loaders are defined in
// fixtures.cc, compiled once into dc_test_support: nlohmann's parser, instantiated in each of the ~30 test files
// that include this header, was about 40 % of such a file's compile time under the sanitizers.)
nlohmann::json load_manifest();

nlohmann::json load_json(const std::string& path);

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
