// --device parsing and the forward's buffers on either device (ops/device.h).
#include "ops/device.h"

#include "core/check.h"
#include "core/workspace.h"
#include "ops/vulkan/runtime.h"

namespace dc {

Result<DeviceSpec> parse_device(std::string_view spec) {
  if (spec == "cpu") return DeviceSpec{};
  if (spec.substr(0, 6) == "vulkan") {  // its errors: a bad index, or a build without Vulkan
    DC_ASSIGN_OR_RETURN(const int index, vk::parse_device_index(spec));
    return DeviceSpec{Device::kVulkan, index};
  }
  return invalid_argument("--device '" + std::string(spec) + "': use cpu, vulkan (device 0) or vulkan:N (`diffucoder devices` lists them)");
}

float* device_floats(const Context& ctx, const char* name, int64_t n) {
  if (ctx.device == Device::kCpu) {
    DC_CHECK(ctx.workspace != nullptr, "device_floats: the CPU needs a workspace");
    return ctx.workspace->floats(name, n);
  }
  return static_cast<float*>(ctx.backend->alloc(name, n * static_cast<int64_t>(sizeof(float))));
}

Status device_status(const Context& ctx) { return ctx.device == Device::kCpu ? Status() : ctx.backend->status(); }

}  // namespace dc
