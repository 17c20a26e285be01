// Loading the Vulkan loader library and the entry points of an instance.
#include "ops/vulkan/loader.h"

#include <dlfcn.h>

namespace dc::vk {

Status load_global(const char* library, Api* api) {
  // Never closed: the loader and the drivers it loads stay mapped for the process (as a linked library would).
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return not_found(std::string("no Vulkan loader: cannot open ") + library + " (" + (why ? why : "unknown") +
                     "); install libvulkan1 and a driver (mesa-vulkan-drivers for the CPU device lavapipe, or the GPU's)");
  }
  api->vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(handle, "vkGetInstanceProcAddr"));
  if (!api->vkGetInstanceProcAddr) return not_found(std::string(library) + " has no vkGetInstanceProcAddr: not a Vulkan loader");
  api->vkCreateInstance =
      reinterpret_cast<PFN_vkCreateInstance>(api->vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkCreateInstance"));
  if (!api->vkCreateInstance) return not_found(std::string(library) + " has no vkCreateInstance: not a Vulkan loader");
  return Status();
}

Status load_instance(VkInstance instance, Api* api) {
#define DC_VK_LOAD(name)                                                                              \
  api->name = reinterpret_cast<PFN_##name>(api->vkGetInstanceProcAddr(instance, #name));              \
  if (!api->name) return internal_error("the Vulkan loader has no " #name " (a Vulkan 1.1 loader is needed)");
  DC_VK_INSTANCE_FUNCTIONS(DC_VK_LOAD)
#undef DC_VK_LOAD
  api->vkGetPhysicalDeviceCooperativeMatrixPropertiesNV = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      api->vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  return Status();
}

std::string result_name(VkResult r) {
  switch (r) {
#define DC_VK_CASE(x) \
  case x:             \
    return #x;
    DC_VK_CASE(VK_SUCCESS) DC_VK_CASE(VK_NOT_READY) DC_VK_CASE(VK_TIMEOUT) DC_VK_CASE(VK_INCOMPLETE)
    DC_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY) DC_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    DC_VK_CASE(VK_ERROR_INITIALIZATION_FAILED) DC_VK_CASE(VK_ERROR_DEVICE_LOST) DC_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    DC_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT) DC_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    DC_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT) DC_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    DC_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS) DC_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    DC_VK_CASE(VK_ERROR_FRAGMENTED_POOL) DC_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY) DC_VK_CASE(VK_ERROR_UNKNOWN)
#undef DC_VK_CASE
    default:
      return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

Status vk_status(VkResult r, const std::string& what) {
  const std::string message = what + ": " + result_name(r);
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
      return resource_exhausted(message + " (free memory or use smaller shapes)");
    case VK_ERROR_DEVICE_LOST:
      return internal_error(message + " (the driver reset the device or the GPU faulted; reopen the device)");
    case VK_ERROR_INCOMPATIBLE_DRIVER:
      return not_found(message + " (no Vulkan driver: install mesa-vulkan-drivers or the GPU's driver)");
    default:
      return internal_error(message);
  }
}

}  // namespace dc::vk
