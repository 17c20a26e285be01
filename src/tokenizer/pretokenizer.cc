// PCRE2 wrapper for the Split pre-tokenizer. Patterns are compiled once with UTF | UCP and
// JIT-compiled when the library supports it; matching allocates its state per call.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <string>

namespace dc {
namespace {

// The Unicode White_Space property as the inside of a PCRE2 character class.
constexpr std::string_view kWhiteSpaceRanges =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string translate_pattern_for_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceRanges;
        } else {
          out += '[';
          out += kWhiteSpaceRanges;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceRanges;
        out += ']';
      } else {  // any other escape (including \S inside a class) is kept as written
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:name:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;
RegexSplitter::~RegexSplitter() = default;

Result<RegexSplitter> RegexSplitter::create(std::string_view pattern, bool literal) {
  const std::string translated = literal ? std::string(pattern) : translate_pattern_for_pcre2(pattern);
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;  // LITERAL excludes UCP
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  auto impl = std::make_unique<Impl>();
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                             &error_code, &error_offset, nullptr);
  if (impl->code == nullptr) {
    return invalid_argument("pre-tokenizer regex '" + std::string(pattern) + "' does not compile with PCRE2 (" +
                            pcre2_error_text(error_code) + " at offset " + std::to_string(error_offset) +
                            " of the translated pattern '" + translated + "')");
  }
  uint32_t has_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &has_jit);
  impl->jit = has_jit != 0 && pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return RegexSplitter(std::move(impl));
}

Status RegexSplitter::split(std::string_view text, std::vector<std::string_view>* pieces) const {
  if (text.empty()) return Status::ok_status();
  struct State {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mctx = nullptr;
    pcre2_jit_stack* stack = nullptr;
    ~State() {
      pcre2_match_data_free(md);
      pcre2_match_context_free(mctx);
      pcre2_jit_stack_free(stack);
    }
  } st;
  st.md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  if (st.md == nullptr) return internal_error("pre-tokenizer: out of memory for PCRE2 match data");

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;    // where the next search starts
  size_t emitted = 0;   // end of the last piece pushed
  while (offset < text.size()) {
    int rc = pcre2_match(impl_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && st.stack == nullptr) {
      // Very long runs can exhaust the default 32 KiB JIT stack; retry this call with a large one.
      st.mctx = pcre2_match_context_create(nullptr);
      st.stack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, nullptr);
      if (st.mctx == nullptr || st.stack == nullptr) return internal_error("pre-tokenizer: out of memory for JIT stack");
      pcre2_jit_stack_assign(st.mctx, nullptr, st.stack);
      rc = pcre2_match(impl_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return internal_error("pre-tokenizer: PCRE2 match failed at byte " + std::to_string(offset) + ": " +
                            pcre2_error_text(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match splits nothing; step over one code point
      offset = begin + 1;
      while (offset < text.size() && (static_cast<uint8_t>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (begin > emitted) pieces->push_back(text.substr(emitted, begin - emitted));
    pieces->push_back(text.substr(begin, end - begin));
    emitted = end;
    offset = end;
  }
  if (emitted < text.size()) pieces->push_back(text.substr(emitted));
  return Status::ok_status();
}

}  // namespace dc
