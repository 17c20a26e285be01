// The GPT-2 byte-level alphabet: each of the 256 byte values is shown as one printable Unicode
// character, so BPE vocabularies can be stored as text. Used both ways (encode and decode).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dc::byte_level {

// The UTF-8 text of the character that stands for byte `b` (e.g. 0x20 -> "Ġ", 'a' -> "a").
std::string_view char_of_byte(uint8_t b);

// Maps every character of `text` back to its byte and writes the bytes to `out` (overwritten).
// Returns false (and leaves `out` unspecified) if a character is not in the byte-level alphabet.
// Precondition: `text` is valid UTF-8.
bool to_bytes(std::string_view text, std::string* out);

// The byte-level text of raw `bytes` (each byte replaced by its character).
std::string from_bytes(std::string_view bytes);

}  // namespace dc::byte_level
