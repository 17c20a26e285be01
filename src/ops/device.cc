// --device parsing and the forward's buffers on either device (ops/device.h).
#include "ops/device.h"

#include "core/check.h"
#include "core/workspace.h"

namespace dc {

Result<DeviceSpec> parse_device(std::string_view spec) {
  const Status usage = invalid_argument("--device '" + std::string(spec) +
                                        "': use cpu, vulkan (device 0) or vulkan:N (N = an index of `diffucoder devices`)");
  if (spec == "cpu") return DeviceSpec{};
  if (spec == "vulkan") return DeviceSpec{Device::kVulkan, 0};
  if (spec.substr(0, 7) != "vulkan:" || spec.size() == 7 || spec.size() > 11) return usage;
  int index = 0;
  for (char c : spec.substr(7)) {
    if (c < '0' || c > '9') return usage;
    index = index * 10 + (c - '0');
  }
  return DeviceSpec{Device::kVulkan, index};
}

float* device_floats(const Context& ctx, const char* name, int64_t n) {
  if (ctx.device == Device::kCpu) {
    DC_CHECK(ctx.workspace != nullptr, "device_floats: the CPU needs a workspace");
    return ctx.workspace->floats(name, n);
  }
  return as_operand(device_cast<float>(ctx.backend->alloc(name, n * static_cast<int64_t>(sizeof(float)))));
}

Status device_status(const Context& ctx) { return ctx.device == Device::kCpu ? Status() : ctx.backend->status(); }

}  // namespace dc
