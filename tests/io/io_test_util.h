// Helpers for the io tests: the tests' temporary directory (temp_dir.h), writers for raw files and
// hand-made safetensors headers, and the check of an error's message.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/status.h"
#include "temp_dir.h"

namespace dc::testing {

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// The 8-byte little-endian length prefix followed by `header`, then `buffer`.
inline std::string safetensors_bytes(const std::string& header, const std::string& buffer,
                                     uint64_t length_override = UINT64_MAX) {
  const uint64_t n = length_override == UINT64_MAX ? header.size() : length_override;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + buffer;
}

// Expects failure with a message that contains every needle.
inline void expect_error(const Status& status, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(status.ok()) << "expected an error mentioning " << *needles.begin();
  for (const std::string& needle : needles) {
    EXPECT_NE(status.message().find(needle), std::string::npos)
        << "message lacks \"" << needle << "\": " << status.message();
  }
}

}  // namespace dc::testing
