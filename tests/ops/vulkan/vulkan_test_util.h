// Helpers of the Vulkan tests: the runtime of device 0 (lavapipe in CI) opened once per test binary,
// seeded random data, and weights of every stored kind.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/dtype.h"
#include "core/splitmix64.h"
#include "ops/vulkan/kernels.h"
#include "ops/weight.h"
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

// The CPU's reference kernels: what every device kernel is tested against.
inline Context cpu_reference() {
  Context ctx;
  ctx.reference_kernels = true;
  return ctx;
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

// A weight of each stored kind with its host bytes, as the CPU's WeightView and the upload's HostMatrix.
struct TestWeight {
  std::vector<uint8_t> data, scales, mins;
  WeightView view;
  vk::HostMatrix host;
};

inline TestWeight make_weight(const std::string& kind, int64_t rows, int64_t cols, int64_t group_size, uint64_t seed) {
  TestWeight t;
  const std::vector<float> values = random_floats(seed, static_cast<size_t>(rows * cols));
  const std::vector<float> tables = random_floats(seed + 1, static_cast<size_t>(rows * cols), 0.01f, 0.1f);
  auto put16 = [](std::vector<uint8_t>& out, uint16_t h) { out.push_back(h & 255), out.push_back(h >> 8); };
  WeightView& v = t.view;
  v.rows = rows, v.cols = cols;
  if (kind == "f32") {
    v.dtype = DType::kF32;
    t.data.resize(values.size() * 4);
    std::memcpy(t.data.data(), values.data(), t.data.size());
  } else if (kind == "f16" || kind == "bf16") {
    v.dtype = kind == "f16" ? DType::kF16 : DType::kBF16;
    for (float f : values) put16(t.data, kind == "f16" ? f32_to_f16(f) : f32_to_bf16(f));
  } else if (kind == "q8") {
    v.dtype = DType::kI8, v.quant = WeightQuant::kQ8;
    for (float f : values) t.data.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::lround(f * 127))));
    t.scales.resize(static_cast<size_t>(rows) * 4);
    std::memcpy(t.scales.data(), tables.data(), t.scales.size());
  } else {  // q4
    v.dtype = DType::kU8, v.quant = WeightQuant::kQ4, v.group_size = group_size;
    for (int64_t i = 0; i < rows * cols / 2; ++i)
      t.data.push_back(static_cast<uint8_t>(static_cast<int>((values[i] + 1) * 8) % 16 | (static_cast<int>((values[i + 1] + 1) * 8) % 16) << 4));
    for (int64_t g = 0; g < rows * cols / group_size; ++g) put16(t.scales, f32_to_f16(tables[g])), put16(t.mins, f32_to_f16(-tables[g + 1] * 4));
  }
  v.data = t.data.data();
  v.scales = t.scales.empty() ? nullptr : t.scales.data();
  v.mins = t.mins.empty() ? nullptr : t.mins.data();
  t.host = {v.dtype, v.quant, rows, cols, v.group_size, v.data, v.scales, v.mins};
  return t;
}

}  // namespace dc::testing
