// Added (and special) tokens: split out of the text before normalisation and BPE, leftmost match
// first and the longest at that position, with the lstrip / rstrip / single_word rules of HF.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dc {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // dropped by decode(..., skip_special_tokens = true)
  bool single_word = false;  // only match when not inside a word
  bool lstrip = false;       // the match absorbs white space on its left
  bool rstrip = false;       // the match absorbs white space on its right
  bool normalized = false;   // matched on the normalised text (else on the raw text)
};

// One piece of a split: a run of plain text, or an added token (id >= 0) with the text it covers.
struct TextSegment {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Matches the contents of `tokens` (which must be non-empty strings) as given.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  // Appends the segments of `text` (valid UTF-8) to `out`, in order, covering all of it; empty
  // plain-text segments are not emitted. Semantics of HF `AddedVocabulary::find_matches`:
  // non-overlapping leftmost-longest matches; a single_word match inside a word is skipped (and
  // the text it covered is not searched again); lstrip/rstrip widen a match over white space.
  void split(std::string_view text, std::vector<TextSegment>* out) const;

 private:
  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into tokens_, longest first
};

}  // namespace dc
