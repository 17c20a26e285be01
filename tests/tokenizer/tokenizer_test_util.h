// Shared helpers of the tokenizer tests: golden paths and loading, a tiny synthetic byte-level
// tokenizer.json, and readable descriptions of id mismatches.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace dc::test {

inline std::string golden_path(const std::string& name) { return std::string(DC_GOLDENS_DIR) + "/tokenizer/" + name; }

inline nlohmann::json load_golden(const std::string& name) {
  std::ifstream in(golden_path(name), std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden " << golden_path(name)
                         << "; run ctest (fixture tokenizer_goldens) or node tests/tokenizer/make_goldens.js";
  if (!in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

// The DiffuCoder tokenizer written by make_goldens.js, loaded once per test process.
inline const Tokenizer& diffucoder_tokenizer() {
  static const Tokenizer* tok = [] {
    auto r = Tokenizer::from_file(golden_path("diffucoder-tokenizer.json"));
    if (!r.ok()) {
      ADD_FAILURE() << r.status().to_string();
      std::abort();
    }
    return new Tokenizer(std::move(r).value());
  }();
  return *tok;
}

// "<id>:<token>" for each id of ids[begin, end), for failure messages.
inline std::string show_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t begin, size_t end) {
  std::ostringstream s;
  s << "[";
  for (size_t i = begin; i < std::min(end, ids.size()); ++i) {
    const auto t = tok.id_to_token(ids[i]);
    s << (i > begin ? " " : "") << ids[i] << ":" << (t ? std::string(*t) : "?");
  }
  s << "]";
  return s.str();
}

// Empty when equal; else the first differing index and the ids around it on both sides.
inline std::string describe_mismatch(const Tokenizer& tok, const std::vector<int32_t>& expected,
                                     const std::vector<int32_t>& actual) {
  if (expected == actual) return {};
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  const size_t begin = i >= 8 ? i - 8 : 0;
  std::ostringstream s;
  s << "first difference at index " << i << " (expected " << expected.size() << " ids, got " << actual.size()
    << ")\n  expected[" << begin << "..]: " << show_ids(tok, expected, begin, i + 8) << "\n  actual  [" << begin
    << "..]: " << show_ids(tok, actual, begin, i + 8);
  return s.str();
}

// A tiny tokenizer.json: the 256 byte tokens (id = byte), merges h+e, l+l, he+ll, hell+o, Ġ+w,
// two added tokens, in the Qwen2 layout. Tests edit the JSON to make broken variants.
inline nlohmann::json tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(byte_level::char_of_byte(static_cast<uint8_t>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  nlohmann::json merge_list = nlohmann::json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back({a, b});
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = {
      {{"id", next}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
      {{"id", next + 1}, {"content", "<tool>"}, {"special", false}, {"normalized", false}},
  };
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", std::string(kQwen2Pattern)}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", merge_list}};
  return j;
}

inline Result<Tokenizer> load_json(const nlohmann::json& j) { return Tokenizer::from_json_text(j.dump(), "tiny.json"); }

}  // namespace dc::test
