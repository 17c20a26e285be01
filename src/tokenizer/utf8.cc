// UTF-8 validation and repair follow the Unicode "maximal subpart" rule (Table 3-7 of the standard);
// NFC goes through utf8proc.
#include "tokenizer/utf8.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <utf8proc.h>

namespace dc::utf8 {
namespace {

// Length of the well-formed prefix of the sequence starting at s[i] (0 if s[i] cannot start
// one), and in *expected the length a complete sequence with this lead byte would have.
size_t well_formed_prefix(std::string_view s, size_t i, size_t* expected) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) { *expected = 1; return 1; }
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    *expected = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    *expected = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    *expected = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *expected = 1;
    return 0;
  }
  size_t n = 1;
  for (; n < *expected && i + n < s.size(); ++n) {
    const auto b = static_cast<uint8_t>(s[i + n]);
    const uint8_t l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return n;
}

}  // namespace

std::optional<size_t> find_invalid(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t w;
      std::memcpy(&w, text.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    size_t expected;
    const size_t n = well_formed_prefix(text, i, &expected);
    if (n != expected) return i;
    i += n;
  }
  return std::nullopt;
}

std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t expected;
    const size_t n = well_formed_prefix(bytes, i, &expected);
    if (n == expected) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal ill-formed subpart
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

char32_t next_code_point(std::string_view text, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + *pos;
  if (p[0] < 0x80) { *pos += 1; return p[0]; }
  if (p[0] < 0xE0) { *pos += 2; return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F); }
  if (p[0] < 0xF0) {
    *pos += 3;
    return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *pos += 4;
  return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

void append_code_point(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void nfc(std::string_view text, std::string* out) {
  // Lead bytes below 0xCC encode code points below U+0300: no combining marks, nothing to compose.
  bool trivial = true;
  for (const char c : text) {
    if (static_cast<uint8_t>(c) >= 0xCC) { trivial = false; break; }
  }
  if (trivial) {
    out->assign(text);
    return;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {  // only on invalid UTF-8 or out of memory; the caller validated the input
    out->assign(text);
  } else {
    out->assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  }
  std::free(mapped);
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace dc::utf8
