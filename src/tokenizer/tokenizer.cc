// Encode (added tokens -> NFC -> regex split -> byte-level BPE) and decode (token bytes -> lossy
// UTF-8) of a loaded Tokenizer; loading lives in tokenizer_load.cc.
#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dc {

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const {
  if (const auto bad = utf8::find_invalid(text)) {
    return invalid_argument("encode: the text is not valid UTF-8 at byte " + std::to_string(*bad) + " (of " +
                            std::to_string(text.size()) + ")");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_.empty()) {
    DC_RETURN_IF_ERROR(encode_plain(text, &ids));
    return ids;
  }
  std::vector<TextSegment> segments;
  raw_matcher_.split(text, &segments);
  for (const TextSegment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      DC_RETURN_IF_ERROR(encode_plain(text.substr(s.begin, s.end - s.begin), &ids));
    }
  }
  return ids;
}

Status Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>* ids) const {
  std::string normalized;
  if (nfc_) {
    utf8::nfc(text, &normalized);
    text = normalized;
  }
  if (normalized_matcher_.empty()) return encode_pretokenized(text, ids);
  std::vector<TextSegment> segments;
  normalized_matcher_.split(text, &segments);
  for (const TextSegment& s : segments) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      DC_RETURN_IF_ERROR(encode_pretokenized(text.substr(s.begin, s.end - s.begin), ids));
    }
  }
  return Status::ok_status();
}

Status Tokenizer::encode_pretokenized(std::string_view text, std::vector<int32_t>* ids) const {
  std::vector<std::string_view> pieces{text}, next;
  for (const RegexSplitter& splitter : splitters_) {
    next.clear();
    for (const std::string_view piece : pieces) DC_RETURN_IF_ERROR(splitter.split(piece, &next));
    pieces.swap(next);
  }
  BpeModel::MergeScratch scratch;  // this call's, reused across its words
  for (const std::string_view piece : pieces) bpe_->encode_word(piece, ids, scratch);
  return Status::ok_status();
}

Result<std::string> Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !(flags_[id] & kPresent)) {
      return out_of_range("decode: ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                          " is not a token id (vocab size " + std::to_string(vocab_size()) + ")");
    }
    if (skip_special_tokens && (flags_[id] & kSpecial)) continue;
    bytes += bytes_of(id);
  }
  return utf8::lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const int32_t id = token_ids_.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::optional<std::string_view> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(flags_[id] & kPresent)) return std::nullopt;
  return text_of(id);
}

int64_t Tokenizer::max_token_bytes() const {
  int64_t longest = 1;
  for (const TokenSpan& span : spans_) longest = std::max<int64_t>(longest, span.bytes_size);
  return longest;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && (flags_[id] & kSpecial);
}

}  // namespace dc
