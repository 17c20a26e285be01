// grown: a grow-only std::vector used as a reusable buffer (per-thread scratch kept across calls).
#pragma once

#include <cstdint>
#include <vector>

namespace dc {

// buf grown to at least `size` elements (never shrunk); the contents are unspecified.
template <typename T>
T* grown(std::vector<T>& buf, int64_t size) {
  if (static_cast<int64_t>(buf.size()) < size) buf.resize(static_cast<size_t>(size));
  return buf.data();
}

}  // namespace dc
