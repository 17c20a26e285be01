// WeightView: a read-only 2-D (or 1-D, rows = 1) weight in its stored dtype, usually memory-mapped.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dc {

struct WeightView {
  DType dtype = DType::kF32;
  const void* data = nullptr;  // row-major [rows, cols]; not owned
  int64_t rows = 0;
  int64_t cols = 0;

  bool empty() const { return data == nullptr; }
  // Converts row r to f32 into dst[cols].
  void row_to_f32(int64_t r, float* dst) const {
    convert_to_f32(dtype, static_cast<const char*>(data) + r * cols * dtype_size(dtype), dst, cols);
  }
};

}  // namespace dc
