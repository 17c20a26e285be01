// How far a device run's updated values are from the CPU's (trainer_vulkan_test.cc, grpo_vulkan_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dc::train {

// max |got − want| over max |want − initial| (initial null: zeros): the device's distance from the CPU's update,
// against the update's size; infinite for a NaN, a failure when nothing was updated.
inline double off_the_update(const float* got, const float* want, const float* initial, int64_t n) {
  double max_step = 0, max_diff = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_step = std::max(max_step, std::abs(static_cast<double>(want[i]) - (initial != nullptr ? initial[i] : 0.0f)));
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  EXPECT_GT(max_step, 0) << "not updated";
  return max_diff / max_step;
}

}  // namespace dc::train
