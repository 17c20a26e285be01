// libFuzzer target for the GGUF reader (gguf/gguf_file.h) and the block dequantizers. Built and run by
// scripts/fuzz.sh (seeds in tests/fuzz/seeds/gguf/).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/quants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = dc::parse_gguf(data, size, "fuzz.gguf");
  if (!parsed.ok()) {
    if (parsed.status().message().find("fuzz.gguf") == std::string::npos) __builtin_trap();  // errors name the file
    return 0;
  }
  for (const auto& [key, v] : parsed->metadata)
    for (uint64_t k = 0; v.raw != nullptr && k < v.n; ++k) (void)v.int_at(k);
  for (const dc::GgufTensor& t : parsed->tensors) {
    // Every accepted tensor lies inside the input; dequantize its first row.
    if (t.data < data || t.data + t.n_bytes > data + size) __builtin_trap();
    std::vector<float> row(static_cast<size_t>(t.dims[0]));
    if (row.size() <= (1u << 16)) dc::gguf_dequantize(t.type, t.data, row.data(), t.dims[0]);
  }
  return 0;
}
