// The backend's entry points in a build without Vulkan (DIFFUCODER_VULKAN off or not found): every one
// says so, so `diffucoder devices` and --device vulkan give a clear error instead of failing to link.
#include "ops/vulkan/runtime.h"

namespace dc::vk {

namespace {
Status not_built() {
  return unimplemented("this diffucoder was built without the Vulkan backend: install libvulkan-dev and glslc "
                       "(scripts/setup.sh) and rebuild (cmake -DDIFFUCODER_VULKAN=ON)");
}
}  // namespace

bool compiled_in() { return false; }
Result<std::vector<DeviceInfo>> list_devices(const char*) { return not_built(); }
Result<int> parse_device_index(std::string_view) { return not_built(); }
struct Runtime::Impl {};
Runtime::~Runtime() = default;
Result<std::unique_ptr<Runtime>> Runtime::open(int, const char*) { return not_built(); }

}  // namespace dc::vk
