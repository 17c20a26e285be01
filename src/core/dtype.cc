// Element type names and the f16 conversions.
#include "core/dtype.h"

#include <cmath>

namespace dc {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kU8: return 1;
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;                 // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;                // overflow (rounds to inf)
  if (ax < 0x38800000u) {                                       // subnormal or zero in f16
    float a;
    std::memcpy(&a, &ax, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // a / 2^-24, RNE
  }
  uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);           // RNE on the 13 dropped bits
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

void convert_to_f32(DType dtype, const void* src, float* dst, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
    case DType::kU8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = s[i];
      return;
    }
  }
}

}  // namespace dc
