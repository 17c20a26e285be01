// The device trainer tests' distance of two tensors (grpo_vulkan_test.cc, loss_rows_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dc::train {

// max |a − b| over max |b|, the two tensors' relative distance (infinite at a NaN).
inline double relative_distance(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace dc::train
