// Helpers of the GGUF tests: raw GGUF bytes built field by field (so that tests can break any field),
// the tests' temporary directory, and f16 bit patterns.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace dc::test {

struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t x[sizeof(T)];
    std::memcpy(x, &v, sizeof(T));
    b.insert(b.end(), x, x + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& pad_to(size_t alignment) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
};

// A tensor info entry: name, dims (ggml order), type, offset.
inline void tensor_info(Bytes& out, const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                        uint64_t offset) {
  out.str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) out.put<uint64_t>(d);
  out.put<uint32_t>(type).put<uint64_t>(offset);
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace dc::test
