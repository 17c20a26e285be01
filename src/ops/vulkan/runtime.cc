// The Vulkan runtime: instance, device, queue, buffers, uploads and the pipeline cache (runtime.h).
#include "ops/vulkan/runtime.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ops/vulkan/runtime_impl.h"
#include "ops/vulkan/spirv.h"

namespace dc::vk {

bool compiled_in() { return true; }

namespace {

const char* device_type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

// Mesa's Vulkan drivers (libvulkan_*.so: lavapipe, radv, anv) stay loaded once the loader has opened them
// (RTLD_NODELETE on the loaded object): their one-time initialisation (lavapipe's LLVM) runs once per process
// instead of once per device opened, and what it allocates stays reachable. (With the driver unloaded at
// vkDestroyInstance, LeakSanitizer reported the 128 bytes lavapipe's initialisation keeps as leaked, on AMD hosts.)
void keep_drivers_loaded() {
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) -> int {
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "/libvulkan_") != nullptr)
          dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);  // a reference never closed
        return 0;
      },
      nullptr);
}

}  // namespace

Status Instance::create(const char* loader) {
  DC_RETURN_IF_ERROR(load_global(loader, &api));
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "diffucoder";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  const VkResult r = api.vkCreateInstance(&info, nullptr, &instance);
  if (r != VK_SUCCESS) {
    instance = VK_NULL_HANDLE;
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
      return not_found("no Vulkan driver (vkCreateInstance: " + result_name(r) +
                       "): install mesa-vulkan-drivers (lavapipe) or the GPU's driver, and check VK_ICD_FILENAMES");
    return vk_status(r, "vkCreateInstance");
  }
  DC_RETURN_IF_ERROR(load_instance(instance, &api));
  uint32_t n = 0;
  VkResult e = api.vkEnumeratePhysicalDevices(instance, &n, nullptr);
  if (e != VK_SUCCESS) return vk_status(e, "vkEnumeratePhysicalDevices");
  physical.resize(n);
  e = api.vkEnumeratePhysicalDevices(instance, &n, physical.data());
  if (e != VK_SUCCESS && e != VK_INCOMPLETE) return vk_status(e, "vkEnumeratePhysicalDevices");
  physical.resize(n);
  keep_drivers_loaded();
  if (physical.empty())
    return not_found("no Vulkan device: the loader found no driver (install mesa-vulkan-drivers or the GPU's driver, "
                     "and check VK_ICD_FILENAMES)");
  return Status();
}

Instance::~Instance() {
  if (instance) api.vkDestroyInstance(instance, nullptr);
}

namespace {

// DeviceInfo::matrix_units: what shaders/matmul_coop.comp needs of the device (fp16 and the subgroup size
// already in d).
bool has_matrix_units(const Api& api, VkPhysicalDevice pd, const std::vector<VkExtensionProperties>& exts, const DeviceInfo& d) {
  // matmul_coop.comp's shared array: (64 + 128) rows × 18 uvec2 = 27 648 bytes per workgroup.
  constexpr int64_t kMatmulCoopSharedBytes = (64 + 128) * 18 * 8;
  if (!has_extension(exts, "VK_NV_cooperative_matrix") || !api.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV || !d.fp16 ||
      d.subgroup_size != 32 || d.max_shared_bytes < kMatmulCoopSharedBytes)
    return false;
  VkPhysicalDeviceVulkanMemoryModelFeatures model{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coop{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, &model};
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &coop};
  api.vkGetPhysicalDeviceFeatures2(pd, &features);
  if (!coop.cooperativeMatrix || !model.vulkanMemoryModel) return false;
  uint32_t n = 0;
  api.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, nullptr);
  std::vector<VkCooperativeMatrixPropertiesNV> shapes(n, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  api.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(pd, &n, shapes.data());
  for (uint32_t i = 0; i < n; ++i) {
    const VkCooperativeMatrixPropertiesNV& s = shapes[i];
    if (s.MSize == 16 && s.NSize == 16 && s.KSize == 16 && s.AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
        s.BType == VK_COMPONENT_TYPE_FLOAT16_NV && s.CType == VK_COMPONENT_TYPE_FLOAT32_NV && s.DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
        s.scope == VK_SCOPE_SUBGROUP_NV)
      return true;
  }
  return false;
}

}  // namespace

DeviceInfo Instance::describe(int index, int* compute_family) const {
  VkPhysicalDevice pd = physical[static_cast<size_t>(index)];
  DeviceInfo d;
  d.index = index;
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &subgroup};
  api.vkGetPhysicalDeviceProperties2(pd, &props);
  d.name = props.properties.deviceName;
  d.type = device_type_name(props.properties.deviceType);
  const uint32_t v = props.properties.apiVersion;
  d.api_version = std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
                  std::to_string(VK_API_VERSION_PATCH(v));
  d.max_buffer_bytes = props.properties.limits.maxStorageBufferRange;
  d.max_shared_bytes = props.properties.limits.maxComputeSharedMemorySize;
  d.max_workgroup_x = std::min(props.properties.limits.maxComputeWorkGroupInvocations, props.properties.limits.maxComputeWorkGroupSize[0]);
  d.subgroup_size = subgroup.subgroupSize;
  VkPhysicalDeviceShaderFloat16Int8Features f16i8{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f16i8};
  api.vkGetPhysicalDeviceFeatures2(pd, &features);
  d.fp16 = f16i8.shaderFloat16;
  d.int8 = f16i8.shaderInt8;
  uint32_t n_ext = 0;
  api.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  api.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, exts.data());
  exts.resize(n_ext);
  d.bf16 = has_extension(exts, "VK_KHR_shader_bfloat16");
  d.cooperative_matrix = has_extension(exts, "VK_KHR_cooperative_matrix") || has_extension(exts, "VK_NV_cooperative_matrix");
  d.matrix_units = v >= VK_API_VERSION_1_2 && has_matrix_units(api, pd, exts, d);
  VkPhysicalDeviceMemoryProperties mem;
  api.vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  for (uint32_t h = 0; h < mem.memoryHeapCount; ++h)
    if (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      d.device_local_bytes = std::max<int64_t>(d.device_local_bytes, static_cast<int64_t>(mem.memoryHeaps[h].size));
  uint32_t n_fam = 0;
  api.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n_fam, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n_fam);
  api.vkGetPhysicalDeviceQueueFamilyProperties(pd, &n_fam, fams.data());
  int family = -1;
  for (uint32_t i = 0; i < n_fam; ++i) {
    if (!(fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
    // A compute queue with timestamps; a compute-only family (async compute on GPUs) when there is one.
    const bool better = family < 0 || !(fams[i].queueFlags & VK_QUEUE_GRAPHICS_BIT);
    if (fams[i].timestampValidBits > 0 && better) family = static_cast<int>(i);
  }
  d.compute_queue = family >= 0;
  if (compute_family) *compute_family = family;
  return d;
}

Result<std::vector<DeviceInfo>> list_devices(const char* loader) {
  Instance inst;
  DC_RETURN_IF_ERROR(inst.create(loader));
  std::vector<DeviceInfo> out;
  for (size_t i = 0; i < inst.physical.size(); ++i) out.push_back(inst.describe(static_cast<int>(i), nullptr));
  return out;
}

uint32_t push_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- Runtime

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->owner = this;
  const char* profile = std::getenv("DC_VULKAN_PROFILE");
  impl_->profiling = profile != nullptr && std::strcmp(profile, "0") != 0;
  impl_->profile_grids = profile != nullptr && std::strcmp(profile, "2") == 0;
}

namespace {

void print_profile(const Runtime::Impl& m) {
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(m.profile.begin(), m.profile.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (const auto& r : rows) total += r.second.first;
  std::fprintf(stderr, "DC_VULKAN_PROFILE on %s: GPU time per shader\n| shader | calls | ms | ms/call | share |\n|---|---|---|---|---|\n",
               m.info.name.c_str());
  for (const auto& [name, t] : rows)
    std::fprintf(stderr, "| %s | %lld | %.2f | %.4f | %.1f %% |\n", name.c_str(), static_cast<long long>(t.second), t.first,
                 t.first / static_cast<double>(t.second), total > 0 ? 100 * t.first / total : 0.0);
}

}  // namespace

Runtime::~Runtime() {
  Impl& m = *impl_;
  const Api& a = m.inst.api;
  if (!m.device) return;
  a.vkDeviceWaitIdle(m.device);
  if (m.profiling) print_profile(m);
  m.dummy = Buffer();
  for (auto& [key, p] : m.pipelines) a.vkDestroyPipeline(m.device, p, nullptr);
  for (auto& l : m.pipeline_layouts) if (l) a.vkDestroyPipelineLayout(m.device, l, nullptr);
  for (auto& l : m.set_layouts) if (l) a.vkDestroyDescriptorSetLayout(m.device, l, nullptr);
  for (auto& s : m.buffers) {  // buffers the caller leaked: freed with the device
    if (s.buffer) a.vkDestroyBuffer(m.device, s.buffer, nullptr);
    if (s.memory) a.vkFreeMemory(m.device, s.memory, nullptr);
  }
  if (m.command_pool) a.vkDestroyCommandPool(m.device, m.command_pool, nullptr);
  a.vkDestroyDevice(m.device, nullptr);
}

const DeviceInfo& Runtime::info() const { return impl_->info; }
const Counters& Runtime::counters() const { return impl_->counters; }

namespace {

// The device-local memory to use: the heap's `bytes`, or less under DC_VULKAN_MEMORY_MIB (MiB, a decimal number
// above 0 and at most the heap): a smaller device seen by every size check, e.g. to test a run's memory plan.
Result<int64_t> memory_cap(int64_t bytes) {
  const char* env = std::getenv("DC_VULKAN_MEMORY_MIB");
  if (env == nullptr || *env == '\0') return bytes;
  char* end = nullptr;
  errno = 0;
  const double mib = std::strtod(env, &end);
  const double cap = mib * static_cast<double>(1 << 20);
  if (*end != '\0' || errno != 0 || !(cap >= 1) || cap > static_cast<double>(bytes))
    return invalid_argument("DC_VULKAN_MEMORY_MIB='" + std::string(env) + "': expected MiB above 0 and at most the device's " +
                            std::to_string(bytes >> 20) + " MiB (the device memory to use); unset it to use all");
  return static_cast<int64_t>(cap);
}

}  // namespace

Result<std::unique_ptr<Runtime>> Runtime::open(int index, const char* loader) {
  auto impl = std::make_unique<Impl>();
  DC_RETURN_IF_ERROR(impl->inst.create(loader));
  const int n = static_cast<int>(impl->inst.physical.size());
  if (index < 0 || index >= n) {
    std::string names;
    for (int i = 0; i < n; ++i) names += (i ? ", " : "") + std::string("vulkan:") + std::to_string(i) + " (" + impl->inst.describe(i, nullptr).name + ")";
    return out_of_range("--device vulkan:" + std::to_string(index) + ": there " + (n == 1 ? "is 1 Vulkan device" : "are " + std::to_string(n) + " Vulkan devices") +
                        ": " + names);
  }
  int family = -1;
  impl->info = impl->inst.describe(index, &family);
  if (family < 0) return not_found("Vulkan device " + std::to_string(index) + " (" + impl->info.name + ") has no compute queue with timestamps");
  DC_ASSIGN_OR_RETURN(impl->info.device_local_bytes, memory_cap(impl->info.device_local_bytes));
  impl->physical = impl->inst.physical[static_cast<size_t>(index)];
  impl->family = static_cast<uint32_t>(family);
  const Api& a = impl->inst.api;
  VkPhysicalDeviceProperties props;
  a.vkGetPhysicalDeviceProperties(impl->physical, &props);
  impl->timestamp_period_ns = props.limits.timestampPeriod;
  uint32_t n_fam = 0;
  a.vkGetPhysicalDeviceQueueFamilyProperties(impl->physical, &n_fam, nullptr);
  std::vector<VkQueueFamilyProperties> fams(n_fam);
  a.vkGetPhysicalDeviceQueueFamilyProperties(impl->physical, &n_fam, fams.data());
  const uint32_t bits = fams[impl->family].timestampValidBits;
  if (bits < 64) impl->timestamp_mask = (uint64_t{1} << bits) - 1;
  a.vkGetPhysicalDeviceMemoryProperties(impl->physical, &impl->memory);

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = impl->family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkDeviceCreateInfo info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue;
  // The matrix units' shader needs its extension and three features; nothing else is enabled.
  VkPhysicalDeviceShaderFloat16Int8Features f16{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDeviceVulkanMemoryModelFeatures model{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, &f16};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coop{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, &model};
  const char* coop_extension = "VK_NV_cooperative_matrix";
  if (impl->info.matrix_units) {
    f16.shaderFloat16 = VK_TRUE, model.vulkanMemoryModel = VK_TRUE, coop.cooperativeMatrix = VK_TRUE;
    info.pNext = &coop;
    info.enabledExtensionCount = 1;
    info.ppEnabledExtensionNames = &coop_extension;
  }
  VkResult r = a.vkCreateDevice(impl->physical, &info, nullptr, &impl->device);
  if (r != VK_SUCCESS) {
    impl->device = VK_NULL_HANDLE;
    return vk_status(r, "vkCreateDevice on " + impl->info.name);
  }
  a.vkGetDeviceQueue(impl->device, impl->family, 0, &impl->queue);
  VkCommandPoolCreateInfo pool{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool.queueFamilyIndex = impl->family;
  std::unique_ptr<Runtime> rt(new Runtime(std::move(impl)));
  r = a.vkCreateCommandPool(rt->impl_->device, &pool, nullptr, &rt->impl_->command_pool);
  if (r != VK_SUCCESS) return vk_status(r, "vkCreateCommandPool");
  DC_ASSIGN_OR_RETURN(rt->impl_->dummy, rt->alloc(16, "the dummy binding"));
  return rt;
}

// ---- Buffers

Buffer::Buffer(Buffer&& o) noexcept : runtime_(std::exchange(o.runtime_, nullptr)), slot_(o.slot_), id_(o.id_), bytes_(o.bytes_) {}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (runtime_) runtime_->free_buffer(slot_);
    runtime_ = std::exchange(o.runtime_, nullptr);
    slot_ = o.slot_;
    id_ = o.id_;
    bytes_ = o.bytes_;
  }
  return *this;
}
Buffer::~Buffer() {
  if (runtime_) runtime_->free_buffer(slot_);
}

void Runtime::free_buffer(uint32_t slot) {
  Impl& m = *impl_;
  BufferSlot& s = m.buffers[slot];
  m.counters.device_bytes -= s.device_bytes;
  m.inst.api.vkDestroyBuffer(m.device, s.buffer, nullptr);
  m.inst.api.vkFreeMemory(m.device, s.memory, nullptr);
  s = BufferSlot();
  m.free_slots.push_back(slot);
}

Result<BufferSlot> Runtime::Impl::create_buffer(int64_t bytes, bool host_visible, std::string_view what) {
  const Api& a = inst.api;
  BufferSlot s;
  VkBufferCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  info.size = static_cast<VkDeviceSize>(bytes);
  info.usage = host_visible ? VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT
                            : VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkResult r = a.vkCreateBuffer(device, &info, nullptr, &s.buffer);
  if (r != VK_SUCCESS) return vk_status(r, "creating " + std::string(what) + " (" + std::to_string(bytes) + " bytes)");
  VkMemoryRequirements req;
  a.vkGetBufferMemoryRequirements(device, s.buffer, &req);
  const VkMemoryPropertyFlags want = host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                                  : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  int type = -1;
  for (uint32_t t = 0; t < memory.memoryTypeCount && type < 0; ++t)
    if ((req.memoryTypeBits & (1u << t)) && (memory.memoryTypes[t].propertyFlags & want) == want) type = static_cast<int>(t);
  if (type < 0) {
    a.vkDestroyBuffer(device, s.buffer, nullptr);
    return internal_error("no memory type for " + std::string(what) + " on " + info_name());
  }
  VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  alloc.allocationSize = req.size;
  alloc.memoryTypeIndex = static_cast<uint32_t>(type);
  r = a.vkAllocateMemory(device, &alloc, nullptr, &s.memory);
  if (r == VK_SUCCESS) r = a.vkBindBufferMemory(device, s.buffer, s.memory, 0);
  if (r == VK_SUCCESS && host_visible) r = a.vkMapMemory(device, s.memory, 0, VK_WHOLE_SIZE, 0, &s.mapped);
  if (r != VK_SUCCESS) {
    a.vkDestroyBuffer(device, s.buffer, nullptr);
    if (s.memory) a.vkFreeMemory(device, s.memory, nullptr);
    return vk_status(r, "allocating " + std::string(what) + " (" + std::to_string(bytes) + " bytes) on " + info_name());
  }
  return s;
}

void Runtime::Impl::destroy_buffer(BufferSlot& s) {
  if (s.buffer) inst.api.vkDestroyBuffer(device, s.buffer, nullptr);
  if (s.memory) inst.api.vkFreeMemory(device, s.memory, nullptr);
  s = BufferSlot();
}

Result<Buffer> Runtime::alloc(int64_t bytes, std::string_view what) { return alloc_buffer(bytes, what, false); }
Result<Buffer> Runtime::alloc_staging(int64_t bytes, std::string_view what) { return alloc_buffer(bytes, what, true); }

Result<Buffer> Runtime::alloc_buffer(int64_t bytes, std::string_view what, bool staging) {
  Impl& m = *impl_;
  const std::string name(what);
  if (bytes <= 0) return invalid_argument(name + ": a device buffer needs a positive size, got " + std::to_string(bytes));
  if (bytes > m.info.device_local_bytes)
    return resource_exhausted(name + ": " + std::to_string(bytes) + " bytes exceed the device-local memory of " + m.info.name + " (" +
                              std::to_string(m.info.device_local_bytes >> 20) + " MiB); use smaller shapes or a device with more memory");
  if (bytes > m.info.max_buffer_bytes)
    return out_of_range(name + ": " + std::to_string(bytes) + " bytes exceed the largest storage buffer of " + m.info.name + " (maxStorageBufferRange " +
                        std::to_string(m.info.max_buffer_bytes) + " bytes); use smaller shapes");
  DC_ASSIGN_OR_RETURN(BufferSlot s, m.create_buffer(bytes, staging, what));
  if (!staging) {
    s.device_bytes = bytes;
    m.counters.device_bytes += bytes;
    m.counters.device_peak_bytes = std::max(m.counters.device_peak_bytes, m.counters.device_bytes);
  }
  uint32_t slot;
  if (!m.free_slots.empty()) {
    slot = m.free_slots.back();
    m.free_slots.pop_back();
    m.buffers[slot] = s;
  } else {
    slot = static_cast<uint32_t>(m.buffers.size());
    m.buffers.push_back(s);
  }
  Buffer b;
  b.runtime_ = this;
  b.slot_ = slot;
  b.id_ = m.next_buffer_id++;
  b.bytes_ = bytes;
  return b;
}

// ---- Uploads and downloads

struct Upload::Impl {
  Runtime::Impl* rt = nullptr;
  BufferSlot staging;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  bool waited = true;  // nothing in flight until a submit succeeds
  ~Impl() {
    if (!rt) return;
    if (!waited && fence) rt->inst.api.vkWaitForFences(rt->device, 1, &fence, VK_TRUE, UINT64_MAX);
    if (fence) rt->inst.api.vkDestroyFence(rt->device, fence, nullptr);
    if (cmd) rt->inst.api.vkFreeCommandBuffers(rt->device, rt->command_pool, 1, &cmd);
    rt->destroy_buffer(staging);
  }
};

Upload::Upload(Upload&& o) noexcept = default;
Upload& Upload::operator=(Upload&& o) noexcept = default;
Upload::~Upload() = default;

Status Upload::wait() {
  if (!impl_ || impl_->waited) return Status();
  const VkResult r = impl_->rt->inst.api.vkWaitForFences(impl_->rt->device, 1, &impl_->fence, VK_TRUE, UINT64_MAX);
  impl_->waited = true;
  return r == VK_SUCCESS ? Status() : vk_status(r, "waiting for an upload");
}

Status Runtime::Impl::check_owned(const Buffer& b, const std::string& op) const {
  if (b.empty()) return invalid_argument(op + ": an empty device buffer (never allocated, or moved from)");
  if (b.runtime_ != owner)
    return invalid_argument(op + ": a buffer of another device (or another Runtime of it), not of " + info.name +
                            "; allocate it with this device's Runtime::alloc");
  return Status();
}

Status Runtime::Impl::check_range(const Buffer& b, int64_t offset, int64_t bytes, const char* op) const {
  DC_RETURN_IF_ERROR(check_owned(b, op));
  if ( offset < 0 || bytes < 0 || offset + bytes > b.bytes())
    return out_of_range(std::string(op) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                        ") outside a device buffer of " + std::to_string(b.bytes()) + " bytes");
  return Status();
}

Result<VkCommandBuffer> Runtime::Impl::begin_commands() {
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = command_pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cmd;
  VkResult r = inst.api.vkAllocateCommandBuffers(device, &ai, &cmd);
  if (r != VK_SUCCESS) return vk_status(r, "vkAllocateCommandBuffers");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  r = inst.api.vkBeginCommandBuffer(cmd, &bi);
  if (r != VK_SUCCESS) {
    inst.api.vkFreeCommandBuffers(device, command_pool, 1, &cmd);
    return vk_status(r, "vkBeginCommandBuffer");
  }
  return cmd;
}

Status Runtime::Impl::submit(VkCommandBuffer cmd, VkFence fence, const char* what) {
  VkResult r = inst.api.vkEndCommandBuffer(cmd);
  if (r != VK_SUCCESS) return vk_status(r, std::string(what) + ": vkEndCommandBuffer");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  r = inst.api.vkQueueSubmit(queue, 1, &si, fence);
  ++counters.submits;
  return r == VK_SUCCESS ? Status() : vk_status(r, std::string(what) + ": vkQueueSubmit");
}

// Starts a copy between `device_buffer` at `offset` and a new staging buffer (to_device: from `src`, which
// is copied into the staging buffer first), submitted with a fence of its own.
Result<Upload> Runtime::start_copy(const Buffer& device_buffer, int64_t offset, int64_t bytes, bool to_device,
                                   const void* src) const {
  Impl& m = *impl_;
  DC_RETURN_IF_ERROR(m.check_range(device_buffer, offset, bytes, to_device ? "upload" : "download"));
  Upload up;
  up.impl_ = std::make_unique<Upload::Impl>();
  Upload::Impl& u = *up.impl_;
  u.rt = &m;
  if (bytes == 0) return up;
  if (to_device) {
    ++m.counters.uploads;
    m.counters.upload_bytes += bytes;
  } else {
    ++m.counters.downloads;
  }
  DC_ASSIGN_OR_RETURN(u.staging, m.create_buffer(bytes, true, to_device ? "an upload's staging buffer" : "a download's staging buffer"));
  if (to_device) std::memcpy(u.staging.mapped, src, static_cast<size_t>(bytes));
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  const VkResult r = m.inst.api.vkCreateFence(m.device, &fi, nullptr, &u.fence);
  if (r != VK_SUCCESS) {
    u.fence = VK_NULL_HANDLE;
    return vk_status(r, "vkCreateFence");
  }
  DC_ASSIGN_OR_RETURN(u.cmd, m.begin_commands());
  const VkBuffer device = m.buffers[device_buffer.slot_].buffer;
  const VkDeviceSize at = static_cast<VkDeviceSize>(offset), size = static_cast<VkDeviceSize>(bytes);
  if (to_device) {
    const VkBufferCopy region{0, at, size};
    m.inst.api.vkCmdCopyBuffer(u.cmd, u.staging.buffer, device, 1, &region);
  } else {
    const VkBufferCopy region{at, 0, size};
    m.inst.api.vkCmdCopyBuffer(u.cmd, device, u.staging.buffer, 1, &region);
  }
  DC_RETURN_IF_ERROR(m.submit(u.cmd, u.fence, to_device ? "upload" : "download"));
  u.waited = false;
  return up;
}

Result<Upload> Runtime::upload_async(Buffer& dst, const void* src, int64_t bytes, int64_t offset) {
  return start_copy(dst, offset, bytes, true, src);
}

Status Runtime::upload(Buffer& dst, const void* src, int64_t bytes, int64_t offset) {
  DC_ASSIGN_OR_RETURN(Upload up, upload_async(dst, src, bytes, offset));
  return up.wait();
}

Status Runtime::download(const Buffer& src, void* dst, int64_t bytes, int64_t offset) const {
  DC_ASSIGN_OR_RETURN(Upload copy, start_copy(src, offset, bytes, false, nullptr));
  DC_RETURN_IF_ERROR(copy.wait());
  if (bytes > 0) std::memcpy(dst, copy.impl_->staging.mapped, static_cast<size_t>(bytes));
  return Status();
}

Status Runtime::read_staging(const Buffer& staging, void* dst, int64_t bytes) const {
  const Impl& m = *impl_;
  DC_RETURN_IF_ERROR(m.check_range(staging, 0, bytes, "read_staging"));
  const void* mapped = m.buffers[staging.slot_].mapped;
  if (mapped == nullptr) return invalid_argument("read_staging: a device buffer, not a staging buffer");
  if (bytes > 0) std::memcpy(dst, mapped, static_cast<size_t>(bytes));
  return Status();
}

// ---- Pipelines

Result<Runtime::Impl::Pipeline> Runtime::Impl::pipeline(std::string_view shader, const std::vector<int32_t>& spec, size_t n_buffers) {
  if (n_buffers == 0 || n_buffers > kMaxBindings) return invalid_argument("shader " + std::string(shader) + ": 1 to 8 buffers");
  const Api& a = inst.api;
  // The layouts of n_buffers bindings, made once; a failed creation leaves its slot null, so a later call
  // retries it instead of using a null handle.
  if (!set_layouts[n_buffers]) {
    VkDescriptorSetLayoutBinding bindings[kMaxBindings];
    for (uint32_t i = 0; i < n_buffers; ++i) bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    li.bindingCount = static_cast<uint32_t>(n_buffers);
    li.pBindings = bindings;
    VkDescriptorSetLayout layout = VK_NULL_HANDLE;
    const VkResult r = a.vkCreateDescriptorSetLayout(device, &li, nullptr, &layout);
    if (r != VK_SUCCESS) return vk_status(r, "vkCreateDescriptorSetLayout");
    set_layouts[n_buffers] = layout;
  }
  if (!pipeline_layouts[n_buffers]) {
    VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, kMaxPushBytes};
    VkPipelineLayoutCreateInfo pi{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pi.setLayoutCount = 1;
    pi.pSetLayouts = &set_layouts[n_buffers];
    pi.pushConstantRangeCount = 1;
    pi.pPushConstantRanges = &range;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    const VkResult r = a.vkCreatePipelineLayout(device, &pi, nullptr, &layout);
    if (r != VK_SUCCESS) return vk_status(r, "vkCreatePipelineLayout");
    pipeline_layouts[n_buffers] = layout;
  }
  auto it = pipelines.find(PipelineKeyView{shader, spec});
  if (it != pipelines.end()) return Pipeline{it->second, pipeline_layouts[n_buffers], set_layouts[n_buffers]};
  const SpirvModule spirv = embedded_spirv(shader);
  if (!spirv.bytes) return invalid_argument("no embedded shader named '" + std::string(shader) + "' (src/ops/vulkan/shaders/)");
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = spirv.size;
  mi.pCode = reinterpret_cast<const uint32_t*>(spirv.bytes);
  VkShaderModule module;
  VkResult r = a.vkCreateShaderModule(device, &mi, nullptr, &module);
  if (r != VK_SUCCESS) return vk_status(r, "vkCreateShaderModule " + std::string(shader));
  std::vector<VkSpecializationMapEntry> entries(spec.size());
  for (size_t i = 0; i < spec.size(); ++i) entries[i] = {static_cast<uint32_t>(i), static_cast<uint32_t>(4 * i), 4};
  VkSpecializationInfo si{static_cast<uint32_t>(spec.size()), entries.data(), 4 * spec.size(), spec.data()};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = spec.empty() ? nullptr : &si;
  ci.layout = pipeline_layouts[n_buffers];
  VkPipeline p;
  r = a.vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
  a.vkDestroyShaderModule(device, module, nullptr);
  if (r != VK_SUCCESS) return vk_status(r, "creating the pipeline of " + std::string(shader));
  pipelines.emplace(PipelineKey{std::string(shader), spec}, p);
  return Pipeline{p, pipeline_layouts[n_buffers], set_layouts[n_buffers]};
}

}  // namespace dc::vk
