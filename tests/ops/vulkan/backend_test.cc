// ops' Vulkan DeviceBackend (ops/vulkan_backend.cc) on device 0: an operand that is not one of its buffers
// (a host pointer, memory it freed) is an error of the forward, not undefined behaviour; allocate()'s
// memory lives until its owner frees it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/device.h"

namespace dc {
namespace {

TEST(VulkanBackend, HostPointersAreRefusedClearly) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  std::vector<float> host(8, 1.0f);
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  float* y = static_cast<float*>(b.alloc("y", 32));
  ASSERT_NE(y, nullptr);
  b.add_inplace(y, host.data(), 8);
  const Status s = b.finish();
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not the start of one of"), std::string::npos) << s.message();
  EXPECT_EQ(b.download(host.data(), host.data(), 32).code(), StatusCode::kInvalidArgument);
}

TEST(VulkanBackend, AllocatedMemoryIsKeptUntilFreed) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  auto kept = b.allocate(16, "kept");
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  const std::vector<float> ones(4, 1.0f);
  const float* x = static_cast<const float*>(b.copy_in("x", ones.data(), 16));
  b.add_inplace((*kept)->data(), x, 4);  // undefined contents + 1: overwritten below
  ASSERT_TRUE(b.finish().ok());
  ASSERT_TRUE(b.begin().ok());  // a later forward: the memory is still there
  b.swiglu(x, x, 4, (*kept)->data());
  ASSERT_TRUE(b.finish().ok());
  std::vector<float> got(4);
  ASSERT_TRUE(b.download((*kept)->data(), got.data(), 16).ok());
  EXPECT_NEAR(got[0], 1.0f / (1.0f + std::exp(-1.0f)), 1e-6);
  float* freed = (*kept)->data();
  kept->reset();
  ASSERT_TRUE(b.begin().ok());  // frees it
  EXPECT_EQ(b.download(freed, got.data(), 16).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dc
