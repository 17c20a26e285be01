// The pre-tokenizer: Hugging Face `Split` steps (a regex whose matches and the gaps between them
// become separate pieces, behaviour "Isolated") run with PCRE2 in UTF + UCP mode, JIT-compiled.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dc {

// The Qwen2 pattern and the GPT-2 pattern (what ByteLevel with use_regex=true applies).
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rewrites the Oniguruma/Rust spelling of a pattern for PCRE2: `\s` and `\S` become explicit
// classes of the Unicode White_Space property (PCRE2's own `\s` differs, e.g. on U+180E).
std::string translate_pattern_for_pcre2(std::string_view pattern);

class RegexSplitter {
 public:
  // Compiles `pattern` (Oniguruma syntax as found in tokenizer.json; taken literally when
  // `literal`). Returns InvalidArgument naming the offset when PCRE2 rejects it.
  static Result<RegexSplitter> create(std::string_view pattern, bool literal);

  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;
  ~RegexSplitter();

  // Appends to `pieces` the pieces of `text` in order: every match and every non-empty gap
  // between matches; empty matches are dropped. The views point into `text`.
  // Precondition: `text` is valid UTF-8. Thread-safe (each call uses its own match state).
  Status split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct Impl;
  explicit RegexSplitter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dc
