// open_vulkan_backend in a build without the Vulkan backend: the layer's own error (ops/vulkan/disabled.cc)
// says how to get it.
#include "ops/device.h"
#include "ops/vulkan/runtime.h"

namespace dc {

Result<std::unique_ptr<DeviceBackend>> open_vulkan_backend(int) { return vk::list_devices().status(); }

}  // namespace dc
