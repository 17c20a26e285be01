// open_vulkan_backend in a build without the Vulkan backend: the runtime's own error says how to get it.
#include "ops/device.h"
#include "ops/vulkan/runtime.h"

namespace dc {

Result<std::unique_ptr<DeviceBackend>> open_vulkan_backend(int index) { return vk::Runtime::open(index).status(); }

}  // namespace dc
