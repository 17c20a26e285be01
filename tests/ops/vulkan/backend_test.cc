// ops' Vulkan DeviceBackend (ops/vulkan_backend.cc) on device 0: its memory is a DevicePtr, which no host
// pointer is (the compile-time checks below); an operand that is not one of its buffers (a host pointer
// smuggled through a forward operand, memory it freed) is an error of the forward, not undefined
// behaviour; allocate()'s
// memory lives until its owner frees it; forwards of one shape record once and read their own uploads, and
// their results come back in the same submission.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/device.h"

namespace dc {
namespace {

// Host memory is not device memory: the backend's ops and copies do not take host pointers.
static_assert(!std::is_invocable_v<decltype(&DeviceBackend::add_inplace), DeviceBackend&, float*, const float*, int64_t>);
static_assert(!std::is_invocable_v<decltype(&DeviceBackend::add_inplace), DeviceBackend&, DeviceOut, const float*, int64_t>);
static_assert(std::is_invocable_v<decltype(&DeviceBackend::add_inplace), DeviceBackend&, DeviceOut, DeviceIn, int64_t>);
static_assert(!std::is_invocable_v<decltype(&DeviceBackend::copy_out), DeviceBackend&, const char*, const float*, void*, int64_t>);
static_assert(std::is_same_v<decltype(std::declval<DeviceMemory&>().data()), DevicePtr<float>>);

// A forward of its own that copies device[bytes] out.
Status read_back(DeviceBackend& b, DevicePtr<const void> device, void* host, int64_t bytes) {
  if (Status s = b.begin(); !s.ok()) return s;
  b.copy_out("read_back", device, host, bytes);
  return b.finish();
}

TEST(VulkanBackend, HostPointersAreRefusedClearly) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  std::vector<float> host(8, 1.0f);
  const auto lock = b.lock();
  ASSERT_TRUE(b.begin().ok());
  const DeviceOut y = device_cast<float>(b.alloc("y", 32));
  ASSERT_TRUE(y);
  b.add_inplace(y, as_device(host.data()), 8);  // a host pointer where a front-end expects a device operand
  const Status s = b.finish();
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not the start of one of"), std::string::npos) << s.message();
  EXPECT_EQ(read_back(b, as_device(host.data()), host.data(), 32).code(), StatusCode::kInvalidArgument);
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
  const DeviceIn x = device_cast<const float>(b.copy_in("x", ones.data(), 16));
  b.add_inplace((*kept)->data(), x, 4);  // undefined contents + 1: overwritten below
  ASSERT_TRUE(b.finish().ok());
  ASSERT_TRUE(b.begin().ok());  // a later forward: the memory is still there
  b.swiglu(x, x, 4, (*kept)->data());
  ASSERT_TRUE(b.finish().ok());
  std::vector<float> got(4);
  ASSERT_TRUE(read_back(b, (*kept)->data(), got.data(), 16).ok());
  EXPECT_NEAR(got[0], 1.0f / (1.0f + std::exp(-1.0f)), 1e-6);
  const DeviceOut freed = (*kept)->data();
  kept->reset();
  ASSERT_TRUE(b.begin().ok());  // frees it
  EXPECT_EQ(read_back(b, freed, got.data(), 16).code(), StatusCode::kInvalidArgument);
}

// A weight's copy is keyed by its host data's address: drop_weight forgets it (and frees its weight_memory
// operand), so an upload from the same address with other values (the allocator's reuse) is the new values,
// where without the drop it would be a no-op that keeps the old copy.
TEST(VulkanBackend, ADroppedWeightIsUploadedAfreshFromTheSameAddress) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  std::vector<float> host(6, 1.0f);
  const WeightView w{DType::kF32, host.data(), 2, 3};
  const auto lock = b.lock();
  ASSERT_TRUE(b.add_matrix(w, "w").ok());
  auto first = b.weight_memory(host.data(), "w");
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  std::fill(host.begin(), host.end(), 2.0f);  // the same address, other values
  ASSERT_TRUE(b.add_matrix(w, "w").ok());      // a no-op: the copy at that address is kept
  std::vector<float> got(6);
  ASSERT_TRUE(read_back(b, *first, got.data(), 24).ok());
  EXPECT_EQ(got[0], 1.0f);
  b.drop_weight(host.data());
  EXPECT_EQ(read_back(b, *first, got.data(), 24).code(), StatusCode::kInvalidArgument) << "the dropped copy's operand";
  EXPECT_EQ(b.weight_memory(host.data(), "w").status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.add_matrix(w, "w").ok());
  auto second = b.weight_memory(host.data(), "w");
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_TRUE(read_back(b, *second, got.data(), 24).ok());
  EXPECT_EQ(got, host);
  b.drop_weight(host.data());
  b.drop_weight(host.data());  // nothing there: nothing to do
}

// copy_out beyond its buffer, or twice under one name in a forward, is refused by name; the host memory is
// not written after an error.
TEST(VulkanBackend, BadCopyOutsAreRefusedClearly) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  const auto lock = b.lock();
  const std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> got(8, -1.0f);
  ASSERT_TRUE(b.begin().ok());
  DevicePtr<const void> dx = b.copy_in("x", x.data(), 16);
  b.copy_out("too_long", dx, got.data(), 32);
  Status s = b.finish();
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("copy_out too_long"), std::string::npos) << s.message();
  ASSERT_TRUE(b.begin().ok());
  dx = b.copy_in("x", x.data(), 16);
  b.copy_out("twice", dx, got.data(), 16);
  b.copy_out("twice", dx, got.data() + 4, 16);
  s = b.finish();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("twice in one forward"), std::string::npos) << s.message();
  EXPECT_EQ(got, std::vector<float>(8, -1.0f));
}

// Forwards of one shape with new host inputs each: one command buffer recorded, replayed by the next two,
// and each forward reads the data copied in for it and gets its own result back (the staging copies, in and
// out, travel in its own submission: one submit per forward). A new shape records anew.
TEST(VulkanBackend, ForwardsOfOneShapeRecordOnceAndReadTheirOwnUploads) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  const auto lock = b.lock();
  const DeviceCounters start = b.counters();
  auto forward = [&](int step, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 100.0f * step + i, y[static_cast<size_t>(i)] = -0.5f * i;
    ASSERT_TRUE(b.begin().ok());
    const DeviceIn dx = device_cast<const float>(b.copy_in("x", x.data(), n * 4));
    const DeviceOut dy = device_cast<float>(b.copy_in("y", y.data(), n * 4));
    ASSERT_TRUE(dx && dy);
    b.add_inplace(dy, dx, n);
    b.copy_out("y", dy, got.data(), n * 4);
    ASSERT_TRUE(b.finish().ok());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[static_cast<size_t>(i)], 100.0f * step + 0.5f * i) << "step " << step << ", element " << i;
  };
  for (int step = 0; step < 3; ++step) forward(step, 64);
  DeviceCounters c = b.counters();
  EXPECT_EQ(c.runs - start.runs, 3);
  EXPECT_EQ(c.recordings - start.recordings, 1);
  EXPECT_EQ(c.descriptor_sets - start.descriptor_sets, 1);
  EXPECT_EQ(c.uploads - start.uploads, 6);
  EXPECT_EQ(c.upload_bytes - start.upload_bytes, 6 * 256);
  EXPECT_EQ(c.submits - start.submits, 3);  // one per forward: its uploads, kernels and download
  EXPECT_EQ(c.downloads - start.downloads, 3);
  forward(3, 40);                           // another shape
  EXPECT_EQ(b.counters().recordings - start.recordings, 2);
  forward(4, 64);                           // the first shape again: still recorded
  EXPECT_EQ(b.counters().recordings - start.recordings, 2);
}

// A copy_out above 4 MiB (rows of logits) goes through a staging buffer of its forward's own, freed after it: each
// forward gets its own data back in one submit, and records anew (no pinned host memory of that size is kept).
TEST(VulkanBackend, LargeCopyOutsUseAStagingBufferOfTheirOwn) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  const auto lock = b.lock();
  const int64_t n = (5 << 20) / 4;
  const DeviceCounters start = b.counters();
  for (int forward = 0; forward < 2; ++forward) {
    std::vector<float> x(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 1000) + 1000.0f * forward;
    ASSERT_TRUE(b.begin().ok());
    const DevicePtr<const void> dx = b.copy_in("x", x.data(), n * 4);
    b.copy_out("x", dx, got.data(), n * 4);
    ASSERT_TRUE(b.finish().ok()) << b.status().to_string();
    EXPECT_EQ(got, x) << "forward " << forward;
  }
  const DeviceCounters c = b.counters();
  EXPECT_EQ(c.submits - start.submits, 2);
  EXPECT_EQ(c.recordings - start.recordings, 2);
}

// Segments of one forward with the same commands (each gather of rows starts one) run as often as they were
// collected: the recorded one is submitted twice in the same submission.
TEST(VulkanBackend, RepeatedSegmentsRunEachTime) {
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  DeviceBackend& b = **backend;
  const auto lock = b.lock();
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<int32_t> rows = {0};
  for (int forward = 0; forward < 2; ++forward) {
    ASSERT_TRUE(b.begin().ok());
    const DeviceIn dx = device_cast<const float>(b.copy_in("x", x.data(), 16));
    const DevicePtr<const int32_t> drows = device_cast<const int32_t>(b.copy_in("rows", rows.data(), 4));
    const DeviceOut acc = device_cast<float>(b.alloc("acc", 16));
    const DeviceOut tmp = device_cast<float>(b.alloc("tmp", 16));
    ASSERT_TRUE(dx && drows && acc && tmp);
    b.gather_rows(dx, 4, drows, 1, acc);  // acc = x
    for (int i = 0; i < 2; ++i) {        // two identical segments: acc += x each
      b.gather_rows(dx, 4, drows, 1, tmp);
      b.add_inplace(acc, tmp, 4);
    }
    std::vector<float> got(4);
    b.copy_out("acc", acc, got.data(), 16);
    ASSERT_TRUE(b.finish().ok());
    EXPECT_EQ(got, (std::vector<float>{3, 6, 9, 12})) << "forward " << forward;
  }
}

}  // namespace
}  // namespace dc
