// The Vulkan runtime on device 0 (lavapipe in CI): listing, selection, buffers, uploads, sequences
// replayed, and the error cases — no loader, no driver, a bad index, out of device memory, another
// device's buffer, a failed pipeline layout (injected).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "ops/device.h"
#include "ops/vulkan/kernels.h"
#include "ops/vulkan/runtime.h"
#include "ops/vulkan/runtime_impl.h"
#include "vulkan_test_util.h"

namespace dc {
namespace {

using testing::ok_or_throw;
using testing::vulkan_runtime;

TEST(VulkanRuntime, ListsDevicesWithTheirProperties) {
  auto devices = vk::list_devices();
  ASSERT_TRUE(devices.ok()) << devices.status().to_string();
  ASSERT_FALSE(devices->empty());
  for (const vk::DeviceInfo& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.device_local_bytes, 0) << d.name;
    EXPECT_GT(d.max_buffer_bytes, 0) << d.name;
    EXPECT_GT(d.subgroup_size, 0u) << d.name;
    EXPECT_EQ(d.api_version.find("1."), 0u) << d.api_version;
  }
  EXPECT_EQ(vulkan_runtime().info().name, (*devices)[0].name);
}

TEST(VulkanRuntime, ParsesDeviceNames) {
  EXPECT_EQ(parse_device("cpu")->device, Device::kCpu);
  EXPECT_EQ(parse_device("vulkan")->index, 0);
  EXPECT_EQ(parse_device("vulkan:0")->index, 0);
  EXPECT_EQ(parse_device("vulkan:12")->index, 12);
  EXPECT_EQ(parse_device("vulkan:12")->device, Device::kVulkan);
  for (const char* bad : {"vulkan:", "vulkan:x", "vulkan:-1", "cuda", "vulkan:123456789", "Vulkan"}) {
    auto r = parse_device(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("vulkan:N"), std::string::npos) << r.status().message();
  }
}

// Training under mpirun: `vulkan` is the device of the rank's index on its host, `vulkan:N` every rank's (ranks
// may share one), `vulkan:A,B,...` a map by local rank; a map without this rank's entry names it.
TEST(VulkanRuntime, ParsesARanksDevice) {
  EXPECT_EQ(parse_rank_device("cpu", 1)->device, Device::kCpu);
  EXPECT_EQ(parse_rank_device("vulkan", 0)->index, 0);
  EXPECT_EQ(parse_rank_device("vulkan", 3)->index, 3);
  EXPECT_EQ(parse_rank_device("vulkan:0", 3)->index, 0);
  EXPECT_EQ(parse_rank_device("vulkan:2,0,1", 0)->index, 2);
  EXPECT_EQ(parse_rank_device("vulkan:2,0,1", 2)->index, 1);
  EXPECT_EQ(parse_rank_device("vulkan:0,0", 1)->device, Device::kVulkan);
  auto short_map = parse_rank_device("vulkan:0,0", 2);
  ASSERT_FALSE(short_map.ok());
  EXPECT_EQ(short_map.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_map.status().message().find("no device for local rank 2"), std::string::npos) << short_map.status().message();
  for (const char* bad : {"vulkan:0,", "vulkan:,1", "vulkan:0,x", "vulkan:0,,1", "vulkan:1,12345"}) {
    auto r = parse_rank_device(bad, 0);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("vulkan:A,B,..."), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(parse_rank_device("vulkan:x", 0).ok());
}

TEST(VulkanRuntime, IndexOutOfRangeListsTheDevices) {
  auto r = vk::Runtime::open(99);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("vulkan:0 ("), std::string::npos) << r.status().message();
  EXPECT_EQ(vk::Runtime::open(-1).status().code(), StatusCode::kOutOfRange);
}

TEST(VulkanRuntime, NoLoaderIsAClearError) {
  auto r = vk::list_devices("libvulkan-absent-for-this-test.so.1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no Vulkan loader"), std::string::npos) << r.status().message();
  EXPECT_EQ(vk::Runtime::open(0, "libvulkan-absent-for-this-test.so.1").status().code(), StatusCode::kNotFound);
}

// The loader reads VK_ICD_FILENAMES and its newer name VK_DRIVER_FILES at each vkCreateInstance.
TEST(VulkanRuntime, NoDriverIsAClearError) {
  const char* names[2] = {"VK_ICD_FILENAMES", "VK_DRIVER_FILES"};
  std::string saved[2];
  bool had[2];
  for (int i = 0; i < 2; ++i) {
    const char* v = std::getenv(names[i]);
    had[i] = v != nullptr, saved[i] = v ? v : "";
    setenv(names[i], "/nonexistent", 1);
  }
  auto r = vk::list_devices();
  auto opened = vk::Runtime::open(0);
  for (int i = 0; i < 2; ++i) {
    if (had[i]) setenv(names[i], saved[i].c_str(), 1);
    else unsetenv(names[i]);
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("mesa-vulkan-drivers"), std::string::npos) << r.status().message();
  EXPECT_EQ(opened.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(vk::list_devices().ok());  // and the driver is found again
}

TEST(VulkanRuntime, OutOfDeviceMemoryIsAClearError) {
  vk::Runtime& rt = vulkan_runtime();
  auto huge = rt.alloc(rt.info().device_local_bytes + 1, "a test buffer beyond the heap");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("a test buffer beyond the heap"), std::string::npos) << huge.status().message();
  if (rt.info().max_buffer_bytes < rt.info().device_local_bytes) {
    auto wide = rt.alloc(rt.info().max_buffer_bytes + 4, "a test buffer beyond the binding range");
    EXPECT_EQ(wide.status().code(), StatusCode::kOutOfRange);
  }
  EXPECT_EQ(rt.alloc(0, "empty").status().code(), StatusCode::kInvalidArgument);
  // The device still works.
  const std::vector<float> v = {1, 2, 3};
  auto b = ok_or_throw(rt.make_buffer(v, "after the failures"));
  EXPECT_EQ(ok_or_throw(rt.read<float>(b, 3)), v);
}

TEST(VulkanRuntime, UploadsAndDownloadsAtOffsets) {
  vk::Runtime& rt = vulkan_runtime();
  auto b = ok_or_throw(rt.alloc(64, "buf"));
  const std::vector<uint8_t> ones(64, 1), pattern = {9, 8, 7, 6, 5};
  ok_or_throw(rt.upload(b, ones.data(), 64));
  ok_or_throw(rt.upload(b, pattern.data(), 5, 13));
  std::vector<uint8_t> got(7);
  ok_or_throw(rt.download(b, got.data(), 7, 12));
  EXPECT_EQ(got, (std::vector<uint8_t>{1, 9, 8, 7, 6, 5, 1}));
  EXPECT_EQ(rt.download(b, got.data(), 7, 60).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(rt.upload(b, got.data(), 1, -1).code(), StatusCode::kOutOfRange);
}

TEST(VulkanRuntime, AsynchronousUploadsLandAfterTheirFences) {
  vk::Runtime& rt = vulkan_runtime();
  std::vector<vk::Buffer> buffers;
  std::vector<vk::Upload> uploads;
  for (int i = 0; i < 4; ++i) {
    std::vector<float> v = testing::random_floats(i, 1000);
    buffers.push_back(ok_or_throw(rt.alloc(4000, "async")));
    uploads.push_back(ok_or_throw(rt.upload_async(buffers.back(), v.data(), 4000)));
    v.assign(1000, 0.0f);  // the host copy may change at once: the upload holds its own staging copy
  }
  for (vk::Upload& u : uploads) ok_or_throw(u.wait());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ok_or_throw(rt.read<float>(buffers[i], 1000)), testing::random_floats(i, 1000)) << i;
}

// A sequence recorded once and replayed reads the buffers' current contents each run.
TEST(VulkanRuntime, SequencesReplayOnNewContents) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 300;
  auto y = ok_or_throw(rt.make_buffer(std::vector<float>(n, 1.0f), "y"));
  auto x = ok_or_throw(rt.make_buffer(std::vector<float>(n, 2.0f), "x"));
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::add_inplace(seq, y, x, n));
  ok_or_throw(vk::add_inplace(seq, y, x, n));  // sees the first add's result (the barrier between dispatches)
  EXPECT_EQ(seq.dispatches(), 2);
  ok_or_throw(seq.run());
  EXPECT_EQ(ok_or_throw(rt.read<float>(y, n)), std::vector<float>(n, 5.0f));
  ok_or_throw(rt.upload(x, std::vector<float>(n, -1.0f).data(), n * 4));
  const double ms = ok_or_throw(seq.run_timed());
  EXPECT_GE(ms, 0.0);
  EXPECT_EQ(ok_or_throw(rt.read<float>(y, n)), std::vector<float>(n, 3.0f));
  // Recording after the first run is refused (record a new sequence for a new shape).
  EXPECT_EQ(vk::add_inplace(seq, y, x, n).code(), StatusCode::kInvalidArgument);
}

// A download in a sequence: each run leaves that run's result in the staging buffer (after the kernel that
// wrote it), with no submission of its own; a device buffer as staging and a staging buffer as the source are
// refused.
TEST(VulkanRuntime, SequenceDownloadsReadEachRunsResult) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 300;
  auto y = ok_or_throw(rt.make_buffer(std::vector<float>(n, 1.0f), "y"));
  auto x = ok_or_throw(rt.make_buffer(std::vector<float>(n, 2.0f), "x"));
  auto out = ok_or_throw(rt.alloc_staging(n * 4, "out"));
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::add_inplace(seq, y, x, n));
  ok_or_throw(seq.download(y, out));
  const int64_t submits = rt.counters().submits;
  std::vector<float> got(n);
  for (float want : {3.0f, 5.0f, 7.0f}) {
    ok_or_throw(seq.run());
    ok_or_throw(rt.read_staging(out, got.data(), n * 4));
    EXPECT_EQ(got, std::vector<float>(n, want));
  }
  EXPECT_EQ(rt.counters().submits - submits, 3);
  EXPECT_EQ(rt.read_staging(out, got.data(), n * 4 + 4).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(rt.read_staging(y, got.data(), 4).code(), StatusCode::kInvalidArgument);
  auto other = ok_or_throw(rt.new_sequence());
  EXPECT_EQ(other.download(x, y).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(other.download(out, out).code(), StatusCode::kInvalidArgument);
}

TEST(VulkanRuntime, UnknownShaderIsAnError) {
  vk::Runtime& rt = vulkan_runtime();
  auto seq = ok_or_throw(rt.new_sequence());
  auto b = ok_or_throw(rt.alloc(16, "b"));
  const Status s = seq.record({"no_such_shader", {}, {&b}, {}, 1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no_such_shader"), std::string::npos) << s.message();
  std::vector<uint32_t> too_many(33, 0);
  EXPECT_EQ(seq.record({"elementwise", {1}, {&b, &b, &b}, too_many, 1}).code(), StatusCode::kInvalidArgument);
}

// A buffer of another Runtime, or an empty one, is refused by uploads, downloads and dispatches.
TEST(VulkanRuntime, ForeignAndEmptyBuffersAreRefused) {
  vk::Runtime& rt = vulkan_runtime();
  auto other = ok_or_throw(vk::Runtime::open(0));
  vk::Buffer theirs = ok_or_throw(other->alloc(64, "theirs")), mine = ok_or_throw(rt.alloc(64, "mine")), empty;
  const std::vector<float> v(16, 1.0f);
  const Status up = rt.upload(theirs, v.data(), 64);
  EXPECT_EQ(up.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(up.message().find("another device"), std::string::npos) << up.message();
  std::vector<float> got(16);
  EXPECT_EQ(rt.download(theirs, got.data(), 64).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.upload(empty, v.data(), 0).code(), StatusCode::kInvalidArgument);
  auto seq = ok_or_throw(rt.new_sequence());
  const Status rec = seq.record({"elementwise", {1}, {&mine, &theirs, &mine}, {16}, 1});
  EXPECT_EQ(rec.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rec.message().find("binding 1"), std::string::npos) << rec.message();
  EXPECT_EQ(seq.record({"elementwise", {1}, {&mine, &empty, &mine}, {16}, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(seq.dispatches(), 0);
  theirs = vk::Buffer();  // freed before its runtime
}

// A failed vkCreatePipelineLayout (injected into the runtime's function table) is an error, and the next
// dispatch creates the layout instead of using a null one.
VkResult VKAPI_PTR failing_pipeline_layout(VkDevice, const VkPipelineLayoutCreateInfo*, const VkAllocationCallbacks*,
                                           VkPipelineLayout*) {
  return VK_ERROR_OUT_OF_DEVICE_MEMORY;
}

TEST(VulkanRuntime, FailedPipelineLayoutIsRetried) {
  auto rt = ok_or_throw(vk::Runtime::open(0));  // its own: no layout made yet
  vk::Api& api = rt->impl().inst.api;
  const auto real = api.vkCreatePipelineLayout;
  const int64_t n = 40;
  vk::Buffer y = ok_or_throw(rt->make_buffer(std::vector<float>(n, 1.0f), "y"));
  vk::Buffer x = ok_or_throw(rt->make_buffer(std::vector<float>(n, 2.0f), "x"));
  auto seq = ok_or_throw(rt->new_sequence());
  api.vkCreatePipelineLayout = failing_pipeline_layout;
  const Status failed = vk::add_inplace(seq, y, x, n);
  api.vkCreatePipelineLayout = real;
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted) << failed.to_string();
  ok_or_throw(vk::add_inplace(seq, y, x, n));
  ok_or_throw(seq.run());
  EXPECT_EQ(ok_or_throw(rt->read<float>(y, n)), std::vector<float>(n, 3.0f));
}

}  // namespace
}  // namespace dc
