// libFuzzer target for the STRUCTURE of tokenizer.json: arbitrary bytes through the streaming parser and
// the loader (nesting, types, vocab / merges / added tokens, normalizer and pre-tokenizer trees). Loading
// must end in a Tokenizer or an error naming the file, within the depth and size limits; a loaded
// tokenizer must encode and decode a short text. Seeds: tests/fuzz/seeds/tokenizer_json/. Built and run
// by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tok = dc::Tokenizer::from_json_text(text, "fuzz/tokenizer.json");
  if (!tok.ok()) {
    if (tok.status().message().find("fuzz/tokenizer.json") == std::string::npos) __builtin_trap();  // names the file
    return 0;
  }
  auto ids = tok->encode("def f(x):\n    return x  # ok");
  if (ids.ok()) {
    for (int32_t id : *ids)
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
    if (!tok->decode(*ids).ok()) __builtin_trap();
  }
  return 0;
}
