// The Vulkan handles behind runtime.h (runtime.cc, sequence.cc only).
#pragma once

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/vulkan/loader.h"
#include "ops/vulkan/runtime.h"

namespace dc::vk {

inline constexpr size_t kMaxBindings = 8;
inline constexpr uint32_t kMaxPushBytes = 128;  // the minimum every device guarantees

// An instance and its physical devices (list_devices, Runtime::open).
struct Instance {
  Api api;
  VkInstance instance = VK_NULL_HANDLE;
  std::vector<VkPhysicalDevice> physical;
  Instance() = default;
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance();
  // Loads `loader`, creates the instance, enumerates the devices; kNotFound when there is none.
  Status create(const char* loader);
  // The properties of device `index`; *compute_family: its compute queue family, -1 when none.
  DeviceInfo describe(int index, int* compute_family) const;
};

struct BufferSlot {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;  // host-visible (staging) buffers only
  int64_t device_bytes = 0;  // a device-local buffer's size as asked (Counters::device_bytes), 0 for staging
};

struct Runtime::Impl {
  Runtime* owner = nullptr;  // the Runtime whose Buffers this device accepts
  Instance inst;
  DeviceInfo info;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkPhysicalDeviceMemoryProperties memory{};
  float timestamp_period_ns = 1;
  uint64_t timestamp_mask = ~uint64_t{0};  // the queue's timestampValidBits
  uint32_t family = 0;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  VkCommandPool command_pool = VK_NULL_HANDLE;
  std::vector<BufferSlot> buffers;  // indexed by Buffer::slot_
  std::vector<uint32_t> free_slots;
  Buffer dummy;  // bound where a specialization reads no buffer
  VkDescriptorSetLayout set_layouts[kMaxBindings + 1] = {};      // by number of bindings
  VkPipelineLayout pipeline_layouts[kMaxBindings + 1] = {};
  // The pipelines by shader and specialization constants, found without building a key (every dispatch asks).
  struct PipelineKey {
    std::string shader;
    std::vector<int32_t> spec;
  };
  struct PipelineKeyView {
    std::string_view shader;
    std::span<const int32_t> spec;
  };
  struct PipelineKeyLess {
    using is_transparent = void;
    static PipelineKeyView view(const PipelineKey& k) { return {k.shader, k.spec}; }
    static PipelineKeyView view(const PipelineKeyView& k) { return k; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      const PipelineKeyView x = view(a), y = view(b);
      if (x.shader != y.shader) return x.shader < y.shader;
      return std::lexicographical_compare(x.spec.begin(), x.spec.end(), y.spec.begin(), y.spec.end());
    }
  };
  std::map<PipelineKey, VkPipeline, PipelineKeyLess> pipelines;
  mutable Counters counters;
  uint64_t next_buffer_id = 1;
  // DC_VULKAN_PROFILE=1: a timestamp after every command, summed per shader and printed to stderr when the
  // Runtime closes (GPU milliseconds and calls; a sequence submitted twice in one run_all counts once);
  // DC_VULKAN_PROFILE=2: per shader and workgroup grid.
  bool profiling = false, profile_grids = false;
  std::map<std::string, std::pair<double, int64_t>> profile;

  struct Pipeline {
    VkPipeline pipeline;
    VkPipelineLayout layout;
    VkDescriptorSetLayout set_layout;
  };
  // The pipeline of `shader` with these specialization constants and n_buffers bindings (cached).
  Result<Pipeline> pipeline(std::string_view shader, const std::vector<int32_t>& spec, size_t n_buffers);
  Result<BufferSlot> create_buffer(int64_t bytes, bool host_visible, std::string_view what);
  void destroy_buffer(BufferSlot& s);
  // kInvalidArgument unless b is a live buffer of this device (not empty, not another Runtime's).
  Status check_owned(const Buffer& b, const std::string& op) const;
  bool owns(const Buffer& b) const { return !b.empty() && b.runtime_ == owner; }  // check_owned's test, no message
  Status check_range(const Buffer& b, int64_t offset, int64_t bytes, const char* op) const;
  // A one-time command buffer, begun.
  Result<VkCommandBuffer> begin_commands();
  // Ends cmd and submits it, signalling fence.
  Status submit(VkCommandBuffer cmd, VkFence fence, const char* what);
  VkBuffer handle(const Buffer* b) const { return buffers[b ? b->slot_ : dummy.slot_].buffer; }
  const std::string& info_name() const { return info.name; }
};

}  // namespace dc::vk
