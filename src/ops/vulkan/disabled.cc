// The Vulkan layer in a build without the backend (DIFFUCODER_VULKAN off, or its headers / glslc not
// found): the one place that says so. Every way into a device — `diffucoder devices`, --device vulkan
// (ops' open_vulkan_backend) — starts by listing the devices, which fails here with how to get the backend.
#include "ops/vulkan/runtime.h"

namespace dc::vk {

bool compiled_in() { return false; }

Result<std::vector<DeviceInfo>> list_devices(const char*) {
  return unimplemented("this diffucoder was built without the Vulkan backend: install libvulkan-dev and glslc "
                       "(scripts/setup.sh) and rebuild (cmake -DDIFFUCODER_VULKAN=ON)");
}

}  // namespace dc::vk
