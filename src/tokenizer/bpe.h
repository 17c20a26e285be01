// Byte-level BPE model: turns the raw bytes of one pre-tokenized word into vocabulary ids by
// applying merges in rank order (lowest rank first, leftmost first on ties), as Hugging Face does.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/flat_map.h"

namespace dc {

class BpeWordCache;

class BpeModel {
 public:
  struct Merge {
    int32_t left = 0;    // id of the left token
    int32_t right = 0;   // id of the right token
    int32_t merged = 0;  // id of their concatenation
  };

  // byte_ids[b] is the id of the one-byte token for byte b (all 256 must exist).
  // merges are in rank order (index = rank); for a repeated pair the later rank wins, as in HF.
  // word_ids maps whole words (raw bytes) to ids; when ignore_merges is set, a word found there is
  // emitted as that single id without running the merges. Empty unless ignore_merges.
  BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
           std::unordered_map<std::string, int32_t> word_ids, bool ignore_merges);
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // The merges' working memory, owned by the caller and reused across its words (e.g. one per
  // Tokenizer::encode call), so no buffer outlives the call that needs it.
  class MergeScratch {
    friend class BpeModel;
    struct Symbol {
      int32_t id;
      int32_t prev;  // index of the previous live symbol, -1 at the start
      int32_t next;  // index of the next live symbol, -1 at the end
      bool alive;
    };
    struct Candidate {
      int32_t rank;
      int32_t pos;  // index of the left symbol
      int32_t merged;
    };
    std::vector<Symbol> symbols;  // [word bytes]
    std::vector<Candidate> heap;  // pending merges
  };

  // Appends the ids of `word` (raw bytes, not byte-level text; may be any bytes) to `out`, using
  // `scratch` (one caller's) for the merges. Thread-safe for callers with their own scratch: results are
  // memoised in an internal cache shared by all callers.
  void encode_word(std::string_view word, std::vector<int32_t>* out, MergeScratch& scratch) const;

 private:
  struct Rank {
    int32_t rank;
    int32_t merged;
  };
  void run_merges(std::string_view word, std::vector<int32_t>* out, MergeScratch& scratch) const;

  std::array<int32_t, 256> byte_ids_{};
  PairMap<Rank> ranks_;  // (left id, right id) -> rank and merged id
  std::unordered_map<std::string, int32_t> word_ids_;
  bool ignore_merges_ = false;
  std::unique_ptr<BpeWordCache> cache_;
};

}  // namespace dc
