// WeightQuant and QuantizationConfig: how a checkpoint's matrices are quantized (the "quantization"
// block of a converted checkpoint's config.json). Read by io (config.json), ops (WeightView) and model.
#pragma once

#include <cstdint>

namespace dc {

// How a weight's codes map to values (the on-disk formats of `diffucoder convert`, see README.md).
//   kQ8: data I8 [rows, cols], scales F32 [rows]:                 w[r, c] = scales[r] * data[r, c]
//   kQ4: data U8 [rows, cols/2] (column 2i in the low nibble of byte i, 2i+1 in the high nibble),
//        scales and mins F16 [rows, cols/group_size]:           w[r, c] = scale[r, g] * q + min[r, g]
//        with q in [0, 15] the nibble and g = c / group_size.
//   kGguf: ggml's block formats read as a GGUF file stores them (data the tensor's blocks, row r at
//        r · ggml_row_bytes; the type in WeightView::ggml_type, ops/cpu/gguf_blocks.h). Never in config.json.
enum class WeightQuant : uint8_t { kNone, kQ8, kQ4, kGguf };

// The "quantization" object of config.json: {"format": "q8" | "q4", "group_size": G,
// "quantized_by": "diffucoder"}. q8 has one scale per row (group_size 0); q4 needs an even G ≥ 2.
struct QuantizationConfig {
  WeightQuant format = WeightQuant::kNone;  // kNone: no "quantization" object (a dense checkpoint)
  int64_t group_size = 0;
};

}  // namespace dc
