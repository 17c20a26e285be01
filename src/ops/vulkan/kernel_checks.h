// The checks and workgroup arithmetic shared by the kernels' front-ends (kernels.cc, backward_kernels.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "ops/vulkan/kernels.h"

namespace dc::vk::detail {

constexpr int64_t kMaxGroups = 65535;  // the per-dimension workgroup count every device supports

// kInvalidArgument unless `b` holds at least `bytes`.
inline Status need(const Buffer& b, int64_t bytes, const char* op, const char* operand) {
  if (b.empty()) return invalid_argument(std::string(op) + ": " + operand + " is an empty buffer");
  if (b.bytes() < bytes)
    return invalid_argument(std::string(op) + ": " + operand + " holds " + std::to_string(b.bytes()) + " bytes, the shape needs " +
                            std::to_string(bytes));
  return Status();
}

inline Status positive(int64_t v, const char* op, const char* name) {
  if (v <= 0 || v > (int64_t{1} << 31)) return invalid_argument(std::string(op) + ": " + name + " = " + std::to_string(v) + " must be in [1, 2^31]");
  return Status();
}

inline uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }

// kInvalidArgument unless every operand offset (elements: the shaders' 32-bit indices) is in [0, 2^31].
inline Status offsets(std::initializer_list<int64_t> at, const char* op) {
  for (const int64_t o : at)
    if (o < 0 || o > (int64_t{1} << 31)) return invalid_argument(std::string(op) + ": an operand offset of " + std::to_string(o) + " elements is outside [0, 2^31]");
  return Status();
}

// Workgroups of `size` invocations for a grid-stride loop over `count` elements.
inline uint32_t stride_groups(int64_t count, int64_t size) { return u32(std::min<int64_t>((count + size - 1) / size, kMaxGroups)); }

// One workgroup per row for `rows` rows, as a 2-D grid (the shaders read row = x + y · gx).
inline void row_groups(int64_t rows, Dispatch& d) {
  d.groups_x = u32(std::min<int64_t>(rows, kMaxGroups));
  d.groups_y = u32((rows + d.groups_x - 1) / d.groups_x);
}

inline int32_t weight_type(const DeviceMatrix& w) {
  switch (w.quant) {
    case WeightQuant::kQ8: return 3;
    case WeightQuant::kQ4: return 4;
    case WeightQuant::kNone: case WeightQuant::kGguf: break;
  }
  return w.dtype == DType::kF32 ? 0 : w.dtype == DType::kF16 ? 1 : 2;
}

}  // namespace dc::vk::detail
