// UTF-8 helpers of the tokenizer: validation, lossy repair (as Rust's String::from_utf8_lossy),
// code point decoding, NFC normalisation (utf8proc) and the character classes the tokenizer needs.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace dc::utf8 {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed), or nullopt when `text` is valid.
std::optional<size_t> find_invalid(std::string_view text);

// Returns `bytes` with every maximal ill-formed subsequence replaced by U+FFFD, exactly as
// Rust's String::from_utf8_lossy (Unicode "substitution of maximal subparts").
std::string lossy(std::string_view bytes);

// Decodes the code point starting at text[*pos] and advances *pos past it.
// Precondition: `text` is valid UTF-8 and *pos < text.size() lies on a code point boundary.
char32_t next_code_point(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value) to `out`.
void append_code_point(char32_t cp, std::string* out);

// Writes the NFC form of `text` into `out` (overwritten). Precondition: `text` is valid UTF-8.
// Text whose code points are all below U+0300 is already NFC and is copied without utf8proc.
void nfc(std::string_view text, std::string* out);

// The Unicode White_Space property (what Rust's char::is_whitespace and regex `\s` use).
bool is_white_space(char32_t cp);

// Rust regex `\w`: letters, marks, decimal digits, letter numbers, connector punctuation,
// ZWNJ/ZWJ. Used for the single_word rule of added tokens.
bool is_word_char(char32_t cp);

}  // namespace dc::utf8
