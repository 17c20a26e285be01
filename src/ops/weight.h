// WeightView: a read-only 2-D (or 1-D, rows = 1) weight in its stored dtype, usually memory-mapped.
// Dense weights are F32 / F16 / BF16; quantized weights (WeightQuant) hold integer codes plus scales.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dc {

// How a weight's codes map to values (the on-disk formats of `diffucoder convert`, see README.md).
//   kQ8: data I8 [rows, cols], scales F32 [rows]:                 w[r, c] = scales[r] * data[r, c]
//   kQ4: data U8 [rows, cols/2] (column 2i in the low nibble of byte i, 2i+1 in the high nibble),
//        scales and mins F16 [rows, cols/group_size]:           w[r, c] = scale[r, g] * q + min[r, g]
//        with q in [0, 15] the nibble and g = c / group_size.
enum class WeightQuant : uint8_t { kNone, kQ8, kQ4 };

// How a dense weight's elements are laid out in memory.
//   kRowMajor: [rows, cols], as stored in checkpoints.
//   kPanels (dtype kBF16 only): uint32 words [⌈rows/64⌉][⌈cols/2⌉][64]: 64-row panels; in panel P, word
//     (P·⌈cols/2⌉ + p)·64 + r holds row 64·P + r at columns 2p (low half) and 2p + 1 (high half) as bf16.
//     Rows past `rows` and the odd last column are 0. The operand layout of the fast bf16 GEMM
//     (ops/cpu/matmul_fast.cc), written once at load by pack_panels() (ops/matmul.h) so that no
//     forward re-packs the weights.
enum class WeightLayout : uint8_t { kRowMajor, kPanels };
constexpr int64_t kPanelRows = 64;

struct WeightView {
  DType dtype = DType::kF32;
  const void* data = nullptr;  // row-major [rows, cols] (kQ4: [rows, cols/2] bytes); not owned
  int64_t rows = 0;
  int64_t cols = 0;
  // Quantized weights only (dtype is then kI8 for kQ8, kU8 for kQ4); not owned.
  WeightQuant quant = WeightQuant::kNone;
  const void* scales = nullptr;  // kQ8: f32 [rows]; kQ4: f16 bits [rows, cols/group_size]
  const void* mins = nullptr;    // kQ4: f16 bits [rows, cols/group_size]
  int64_t group_size = 0;        // kQ4: columns per scale, divides cols
  WeightLayout layout = WeightLayout::kRowMajor;

  bool empty() const { return data == nullptr; }
  bool quantized() const { return quant != WeightQuant::kNone; }
  // Converts (dequantizes) row r to f32 into dst[cols].
  void row_to_f32(int64_t r, float* dst) const {
    switch (quant) {
      case WeightQuant::kNone:
        if (layout == WeightLayout::kPanels) {
          const int64_t pairs = (cols + 1) / 2;
          const uint32_t* words = static_cast<const uint32_t*>(data) + (r / kPanelRows) * pairs * kPanelRows + r % kPanelRows;
          for (int64_t c = 0; c < cols; ++c)
            dst[c] = bf16_to_f32(static_cast<uint16_t>(words[(c / 2) * kPanelRows] >> (c % 2 ? 16 : 0)));
          return;
        }
        convert_to_f32(dtype, static_cast<const char*>(data) + r * cols * dtype_size(dtype), dst, cols);
        return;
      case WeightQuant::kQ8: {
        const int8_t* q = static_cast<const int8_t*>(data) + r * cols;
        const float s = static_cast<const float*>(scales)[r];
        for (int64_t c = 0; c < cols; ++c) dst[c] = s * static_cast<float>(q[c]);
        return;
      }
      case WeightQuant::kQ4: {
        const uint8_t* q = static_cast<const uint8_t*>(data) + r * (cols / 2);
        const int64_t n_groups = cols / group_size;
        const uint16_t* s = static_cast<const uint16_t*>(scales) + r * n_groups;
        const uint16_t* m = static_cast<const uint16_t*>(mins) + r * n_groups;
        for (int64_t g = 0; g < n_groups; ++g) {
          const float sg = f16_to_f32(s[g]), mg = f16_to_f32(m[g]);
          for (int64_t c = g * group_size; c < (g + 1) * group_size; c += 2) {
            const uint8_t b = q[c / 2];
            dst[c] = sg * static_cast<float>(b & 15) + mg;
            dst[c + 1] = sg * static_cast<float>(b >> 4) + mg;
          }
        }
        return;
      }
    }
  }
};

}  // namespace dc
