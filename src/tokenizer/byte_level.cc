// Byte-level alphabet tables, built once: printable Latin-1 bytes stand for themselves, the other
// 68 bytes take the code points 256, 257, ... in increasing byte order.
#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace dc::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> char_of_byte;
  std::array<int16_t, 324> byte_of_char;  // code point -> byte, or -1

  Tables() {
    byte_of_char.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      utf8::append_code_point(cp, &char_of_byte[b]);
      byte_of_char[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables kTables;
  return kTables;
}

}  // namespace

std::string_view char_of_byte(uint8_t b) { return tables().char_of_byte[b]; }

bool to_bytes(std::string_view text, std::string* out) {
  const Tables& t = tables();
  out->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = utf8::next_code_point(text, &pos);
    if (cp >= t.byte_of_char.size() || t.byte_of_char[cp] < 0) return false;
    out->push_back(static_cast<char>(t.byte_of_char[cp]));
  }
  return true;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out += char_of_byte(static_cast<uint8_t>(c));
  return out;
}

}  // namespace dc::byte_level
