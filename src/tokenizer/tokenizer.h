// The DiffuCoder / Qwen2 tokenizer: a Hugging Face `tokenizer.json` (byte-level BPE, NFC, the
// Qwen2 split regex, added tokens) loaded once, then used read-only from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/pretokenizer.h"

namespace dc {

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer.json. Supported: model BPE (vocab, merges as "a b" strings or
  // [a, b] pairs, ignore_merges; no dropout, no subword prefix/suffix); normalizer null, NFC or a
  // Sequence of those; pre_tokenizer ByteLevel(add_prefix_space false) alone or last in a
  // Sequence after Split(Regex|String, behavior Isolated, invert false); decoder ByteLevel;
  // any post_processor (ignored: encode never adds template tokens). Added-token ids must be the
  // ones HF would assign (the vocab id when the content is in model.vocab, else the next free id
  // in file order). Errors name the file and the JSON field.
  static Result<Tokenizer> from_file(const std::string& tokenizer_json_path);
  // Same, from the JSON text; `source` names it in error messages.
  static Result<Tokenizer> from_json_text(std::string_view json_text, const std::string& source);

  // A byte-level BPE given as parts instead of a tokenizer.json (the GGUF tokenizer metadata, gguf/):
  // the model's tokens with their ids, the merges ("left right", in rank order) and the added tokens,
  // with Qwen2's pipeline (NFC, the Qwen2 split regex, ByteLevel; tokenizer.ggml.pre "qwen2"). Checked
  // as a tokenizer.json with those contents would be; `source` names it in error messages.
  struct BpeParts {
    std::vector<std::pair<std::string_view, int32_t>> vocab;
    std::vector<std::string_view> merges;
    std::vector<AddedToken> added;
  };
  static Result<Tokenizer> from_qwen2_bpe(const BpeParts& parts, const std::string& source);
  // The tokenizer.json text of the same tokenizer (from_file of it equals from_qwen2_bpe of `parts`);
  // InvalidArgument naming `source` when a token or merge is not valid UTF-8.
  static Result<std::string> qwen2_bpe_json(const BpeParts& parts, const std::string& source);

  // Token ids of `text`, as HF `encode(text, add_special_tokens=False)`: added tokens are split
  // out first, the rest is NFC-normalised, split by the regex and BPE-encoded. No BOS/EOS.
  // InvalidArgument (naming the byte offset) when `text` is not valid UTF-8.
  // Thread-safe; may be called concurrently on one Tokenizer.
  Result<std::vector<int32_t>> encode(std::string_view text) const;

  // The text of `ids`: added tokens give their content, byte-level tokens their bytes, and
  // ill-formed UTF-8 in the result becomes U+FFFD (as HF's ByteLevel decoder). With
  // `skip_special_tokens`, added tokens marked special are left out. OutOfRange naming the
  // position when an id has no token (HF silently drops such ids). Thread-safe.
  Result<std::string> decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The id of a token written as in tokenizer.json (byte-level text such as "Ġworld", or an
  // added token's content); added tokens take precedence over the vocab.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token text of `id` as in tokenizer.json; the view lives as long as the Tokenizer.
  std::optional<std::string_view> id_to_token(int32_t id) const;
  // Max id + 1 over the vocab and the added tokens (DiffuCoder-Instruct: 151668).
  int32_t vocab_size() const { return static_cast<int32_t>(flags_.size()); }
  // The BPE merges in rank order as (left id, right id) (what a GGUF writer stores as "left right").
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }
  // The added tokens in file order, with their ids.
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }
  // True when `id` is an added token marked special.
  bool is_special(int32_t id) const;
  // The longest token in bytes (at least 1): a text of n bytes encodes to at least n / max_token_bytes()
  // ids, which bounds a prompt's length before it is tokenised.
  int64_t max_token_bytes() const;

 private:
  enum : uint8_t { kPresent = 1, kSpecial = 2 };
  Tokenizer() = default;
  friend class TokenizerLoader;

  // Appends the ids of `text` (valid UTF-8, no added tokens of the raw pass left in it).
  Status encode_plain(std::string_view text, std::vector<int32_t>* ids) const;
  Status encode_pretokenized(std::string_view text, std::vector<int32_t>* ids) const;
  std::string_view text_of(int32_t id) const { return {text_pool_.data() + spans_[id].text, spans_[id].text_size}; }
  std::string_view bytes_of(int32_t id) const { return {bytes_pool_.data() + spans_[id].bytes, spans_[id].bytes_size}; }

  struct TokenSpan {
    uint32_t text = 0;  // offset into text_pool_
    uint32_t text_size = 0;
    uint32_t bytes = 0;  // offset into bytes_pool_
    uint32_t bytes_size = 0;
  };
  // Pools are vectors so that moving a Tokenizer keeps their buffers, and the views held by
  // token_ids_, in place.
  std::vector<char> text_pool_;   // token texts as written in tokenizer.json
  std::vector<char> bytes_pool_;  // what decode emits for each token
  std::vector<TokenSpan> spans_;  // [vocab_size]
  std::vector<uint8_t> flags_;    // [vocab_size]
  StringIdMap token_ids_;         // views into text_pool_
  std::vector<AddedToken> added_tokens_;
  std::vector<std::pair<int32_t, int32_t>> merges_;  // rank order
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized = false
  AddedTokenMatcher normalized_matcher_;  // added tokens with normalized = true (content NFC'd)
  bool nfc_ = false;
  std::vector<RegexSplitter> splitters_;  // applied in order, each to the pieces of the last
  std::optional<BpeModel> bpe_;
};

}  // namespace dc
