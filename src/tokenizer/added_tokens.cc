// Added-token matching. Few tokens exist (tens), so a scan with a first-byte filter is faster
// than an automaton and gives the same leftmost-longest answer.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dc {
namespace {

// The code point that ends at byte `end` (exclusive). Precondition: end > 0, valid UTF-8.
char32_t code_point_before(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80) --begin;
  return utf8::next_code_point(text, &begin);
}

// Start of the white space that ends at `end`.
size_t white_space_start_before(std::string_view text, size_t end) {
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80) --begin;
    size_t pos = begin;
    if (!utf8::is_white_space(utf8::next_code_point(text, &pos))) break;
    end = begin;
  }
  return end;
}

// End of the white space that starts at `begin`.
size_t white_space_end_after(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    size_t pos = begin;
    if (!utf8::is_white_space(utf8::next_code_point(text, &pos))) break;
    begin = pos;
  }
  return begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
  }
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>* out) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;      // where the search for the next match resumes
  while (pos < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<uint8_t>(text[pos])];
    const AddedToken* match = nullptr;
    for (const uint32_t i : bucket) {
      if (text.substr(pos).starts_with(tokens_[i].content)) {
        match = &tokens_[i];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + match->content.size();
    pos = end;
    if (match->single_word) {
      const bool word_before = begin > 0 && utf8::is_word_char(code_point_before(text, begin));
      size_t after = end;
      const bool word_after = end < text.size() && utf8::is_word_char(utf8::next_code_point(text, &after));
      if (word_before || word_after) continue;
    }
    if (match->lstrip) begin = std::max(white_space_start_before(text, begin), emitted);
    if (match->rstrip) end = white_space_end_after(text, end);
    if (begin > emitted) out->push_back(TextSegment{emitted, begin, -1});
    out->push_back(TextSegment{begin, end, match->id});
    emitted = end;
    // HF keeps iterating the matches it found before widening; a match starting inside the
    // absorbed white space would overlap, so the search resumes after it (tokens never start with
    // white space in practice).
    pos = std::max(pos, end);
  }
  if (emitted < text.size()) out->push_back(TextSegment{emitted, text.size(), -1});
}

}  // namespace dc
