// WeightView: a read-only 2-D (or 1-D, rows = 1) weight in its stored dtype, usually memory-mapped.
// Dense weights are F32 / F16 / BF16; quantized weights (WeightQuant) hold integer codes plus scales.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/gguf_blocks.h"
#include "types/quantization.h"

namespace dc {

// WeightQuant (how a weight's codes map to values) is in types/quantization.h.

// How a dense weight's elements are laid out in memory.
//   kRowMajor: [rows, cols], as stored in checkpoints.
//   kPanels (dtype kBF16 only): uint32 words [⌈rows/64⌉][⌈cols/2⌉][64]: 64-row panels; in panel P, word
//     (P·⌈cols/2⌉ + p)·64 + r holds row 64·P + r at columns 2p (low half) and 2p + 1 (high half) as bf16.
//     Rows past `rows` and the odd last column are 0. The operand layout of the fast bf16 GEMM
//     (ops/cpu/matmul_fast.cc), written once at load by pack_panels() (ops/matmul.h) so that no
//     forward re-packs the weights.
//   kPanelsTransposed (dtype kBF16 only): Wᵀ [rows = W.cols, cols = W.rows] read from W's own kPanels words
//     (data is W's bf16 kPanels copy): element (r, c) is W's (c, r), in word (c/64 · ⌈rows/2⌉ + r/2)·64 + c%64,
//     half r % 2. The backward's dx = dy·W through matmul_nt on the forward's one copy of W: the fast bf16
//     kernel re-pairs each block as it packs it (ops/cpu/matmul_fast.cc); transposed_panels() makes it.
//   kPanels, quantized (kQ8; kQ4 with group_size % 32 == 0): the operand layout of the int8 kernel
//     (ops/cpu/matmul_quant.cc), 32-row panels × 32-column blocks, nb = ⌈cols/32⌉, P = r / 32,
//     v = r % 32 / 16, l = r % 16, b = c / 32, j = c % 32. Rows past `rows` repeat the last row.
//     kQ8: data u8 [⌈rows/32⌉][nb][8 steps][2][64]: code q + 128 of (r, c) at byte
//          ((P·nb + b)·8 + j/4)·128 + v·64 + 4·l + j%4 (columns past `cols` hold 128); scales as kRowMajor.
//     kQ4: data u8 [⌈rows/32⌉][nb][4][2][64]: the byte holding (r, c)'s nibble (low for even j) is
//          ((P·nb + b)·4 + t)·128 + v·64 + 4·l + i%4 with i = j/2, t = i/4 (the row-major byte b·16 + i);
//          scales and mins f16 [⌈rows/32⌉][cols/group_size][32]: group g of row r at (P·n_groups + g)·32 + r%32.
enum class WeightLayout : uint8_t { kRowMajor, kPanels, kPanelsTransposed };
constexpr int64_t kPanelRows = 64;       // bf16 kPanels
constexpr int64_t kQuantPanelRows = 32;  // quantized kPanels
constexpr int64_t kQuantBlock = 32;      // columns per quantized kPanels block

struct WeightView {
  DType dtype = DType::kF32;
  const void* data = nullptr;  // row-major [rows, cols] (kQ4: [rows, cols/2] bytes); not owned
  int64_t rows = 0;
  int64_t cols = 0;
  // Quantized weights only (dtype is then kI8 for kQ8, kU8 for kQ4 and kGguf); not owned.
  WeightQuant quant = WeightQuant::kNone;
  const void* scales = nullptr;  // kQ8: f32 [rows]; kQ4: f16 bits [rows, cols/group_size]
  const void* mins = nullptr;    // kQ4: f16 bits [rows, cols/group_size]
  int64_t group_size = 0;        // kQ4: columns per scale, divides cols
  // kGguf (dtype kU8): the ggml block type of data's blocks, row-major, ggml_row_bytes(type, cols) per row
  // (cols a multiple of the block); no scales or mins (they are inside the blocks); kRowMajor only.
  cpu::GgmlType ggml_type = cpu::GgmlType::kNone;
  WeightLayout layout = WeightLayout::kRowMajor;

  bool empty() const { return data == nullptr; }
  // Quantized kPanels: the byte offset of row r's first code (block 0) for `steps` 128-byte steps per block.
  int64_t panel_offset(int64_t r, int64_t steps) const {
    const int64_t nb = (cols + kQuantBlock - 1) / kQuantBlock;
    return (r / kQuantPanelRows * nb) * steps * 128 + (r % kQuantPanelRows / 16) * 64 + 4 * (r % 16);
  }
  bool quantized() const { return quant != WeightQuant::kNone; }
  // Converts (dequantizes) row r to f32 into dst[cols].
  void row_to_f32(int64_t r, float* dst) const {
    switch (quant) {
      case WeightQuant::kNone:
        if (layout == WeightLayout::kPanelsTransposed) {
          const int64_t pairs = (rows + 1) / 2;
          const uint32_t* words = static_cast<const uint32_t*>(data) + (r / 2) * kPanelRows;
          for (int64_t c = 0; c < cols; ++c)
            dst[c] = bf16_to_f32(static_cast<uint16_t>(words[(c / kPanelRows * pairs) * kPanelRows + c % kPanelRows] >> (r % 2 ? 16 : 0)));
          return;
        }
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
        const float s = static_cast<const float*>(scales)[r];
        if (layout == WeightLayout::kPanels) {
          const uint8_t* u = static_cast<const uint8_t*>(data) + panel_offset(r, 8);
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t j = c % kQuantBlock;
            dst[c] = s * static_cast<float>(static_cast<int>(u[(c / kQuantBlock * 8 + j / 4) * 128 + j % 4]) - 128);
          }
          return;
        }
        const int8_t* q = static_cast<const int8_t*>(data) + r * cols;
        for (int64_t c = 0; c < cols; ++c) dst[c] = s * static_cast<float>(q[c]);
        return;
      }
      case WeightQuant::kGguf:
        cpu::ggml_dequantize(ggml_type, static_cast<const uint8_t*>(data) + r * cpu::ggml_row_bytes(ggml_type, cols), dst, cols);
        return;
      case WeightQuant::kQ4: {
        if (layout == WeightLayout::kPanels) {
          const int64_t n_groups = cols / group_size;
          const uint8_t* u = static_cast<const uint8_t*>(data) + panel_offset(r, 4);
          const int64_t table = (r / kQuantPanelRows * n_groups) * kQuantPanelRows + r % kQuantPanelRows;
          const uint16_t* s = static_cast<const uint16_t*>(scales) + table;
          const uint16_t* m = static_cast<const uint16_t*>(mins) + table;
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t j = c % kQuantBlock, i = j / 2, g = c / group_size;
            const uint8_t byte = u[(c / kQuantBlock * 4 + i / 4) * 128 + i % 4];
            const int q = j % 2 ? byte >> 4 : byte & 15;
            dst[c] = f16_to_f32(s[g * kQuantPanelRows]) * static_cast<float>(q) + f16_to_f32(m[g * kQuantPanelRows]);
          }
          return;
        }
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
