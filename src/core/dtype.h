// Element types of weights and their conversions to and from f32 (round-to-nearest-even for bf16).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace dc {

// kI8 / kU8 hold the codes of quantized weights (ops/weight.h); they are not float types.
enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kU8 };

const char* dtype_name(DType dtype);  // "F32", "F16", "BF16", "I8", "U8" (safetensors spelling)
size_t dtype_size(DType dtype);
inline bool is_float_dtype(DType dtype) { return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of `dtype` at `src` to f32 (integer codes convert to their value).
void convert_to_f32(DType dtype, const void* src, float* dst, size_t n);

}  // namespace dc
