// Helpers of the Vulkan tests: the runtime of device 0 (lavapipe in CI) opened once per test binary, and
// seeded random data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/splitmix64.h"
#include "ops/vulkan/runtime.h"

namespace dc::testing {

// Device 0's runtime, shared by the tests of one binary (opening lavapipe costs ~0.1 s); fails the test
// when there is no device.
inline vk::Runtime& vulkan_runtime() {
  static std::unique_ptr<vk::Runtime> rt = [] {
    auto r = vk::Runtime::open(0);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  if (!rt) throw std::runtime_error("no Vulkan device 0");
  return *rt;
}

// n values uniform in [lo, hi), a function of the seed.
inline std::vector<float> random_floats(uint64_t seed, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  uint64_t state = seed;
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(splitmix64_next(state) >> 40) / static_cast<float>(1 << 24);
  return v;
}

// The Result's value, failing the test (and throwing) when it is an error.
template <typename T>
T ok_or_throw(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status().to_string();
    throw std::runtime_error(r.status().to_string());
  }
  return std::move(r).value();
}
inline void ok_or_throw(const Status& s) {
  if (!s.ok()) {
    ADD_FAILURE() << s.to_string();
    throw std::runtime_error(s.to_string());
  }
}

}  // namespace dc::testing
