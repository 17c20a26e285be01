// Streaming parse of a tokenizer.json: model.vocab and model.merges (150k entries each) go straight
// into flat vectors; everything else becomes a small nlohmann::json tree. Internal to the layer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace dc {

struct TokenizerJson {
  struct VocabEntry {
    uint32_t offset;  // into vocab_pool
    uint32_t size;
    int32_t id;
  };
  struct MergeEntry {
    uint32_t offset;      // into merge_pool: the left text, then the right text
    uint32_t left_size;   // the whole "left right" string when `legacy`
    uint32_t right_size;
    bool legacy;
  };
  nlohmann::json root;  // the document without model.vocab / model.merges when those were streamed
  bool has_vocab = false;   // model.vocab was an object
  bool has_merges = false;  // model.merges was an array
  std::string vocab_pool;
  std::vector<VocabEntry> vocab;  // in file order
  std::string merge_pool;
  std::vector<MergeEntry> merges;  // in rank order

  std::string_view merge_left(const MergeEntry& e) const { return std::string_view(merge_pool).substr(e.offset, e.left_size); }
  std::string_view merge_right(const MergeEntry& e) const {
    return std::string_view(merge_pool).substr(e.offset + e.left_size, e.right_size);
  }
};

// The limits of a tokenizer.json (checked before anything is built from it): nesting of arrays and
// objects (the Qwen2 file nests 5 deep) and the file size (Qwen2: 7 MB).
inline constexpr int kMaxTokenizerJsonDepth = 64;
inline constexpr int64_t kMaxTokenizerJsonBytes = int64_t{512} << 20;

// Parses `text`. ParseError naming `source`, the byte offset and the field for malformed JSON, a NUL
// byte, nesting deeper than kMaxTokenizerJsonDepth, or a vocab / merges entry of the wrong type.
Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& source);

}  // namespace dc
