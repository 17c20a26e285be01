// libFuzzer target for the safetensors header parser and the config.json / generation_config.json
// parsers. Built and run by scripts/fuzz.sh; by hand:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/safetensors_fuzz.cc \
//       src/io/safetensors.cc src/io/config_json.cc src/io/mapped_file.cc src/core/*.cc -o safetensors_fuzz
//   ./safetensors_fuzz -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "io/config_json.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = dc::parse_safetensors(data, size, "fuzz.safetensors");
  if (parsed.ok()) {
    // Every accepted tensor must lie inside the input; touch its first and last byte.
    for (const auto& [name, t] : parsed->tensors) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      if (p < data || p + t.n_bytes > data + size) __builtin_trap();
      if (t.n_bytes > 0) {
        volatile uint8_t sink = p[0];
        sink = p[t.n_bytes - 1];
        (void)sink;
      }
    }
  } else if (parsed.status().message().find("fuzz.safetensors") == std::string::npos) {
    __builtin_trap();  // every error names the file
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = dc::parse_model_config(text, "config.json");
  if (config.ok() && (config->n_head % config->n_head_kv != 0 || config->head_dim <= 0)) __builtin_trap();
  (void)dc::parse_generation_config(text, "generation_config.json");
  return 0;
}
