// --device parsing and the forward's buffers on either device (ops/device.h).
#include "ops/device.h"

#include <string>
#include <vector>

#include "core/check.h"
#include "core/workspace.h"

namespace dc {

namespace {

// A device index of at most 4 digits; -1 when `digits` is not one.
int parse_index(std::string_view digits) {
  if (digits.empty() || digits.size() > 4) return -1;
  int index = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    index = index * 10 + (c - '0');
  }
  return index;
}

}  // namespace

Result<DeviceSpec> parse_device(std::string_view spec) {
  const Status usage = invalid_argument("--device '" + std::string(spec) +
                                        "': use cpu, vulkan (device 0) or vulkan:N (N = an index of `diffucoder devices`)");
  if (spec == "cpu") return DeviceSpec{};
  if (spec == "vulkan") return DeviceSpec{Device::kVulkan, 0};
  const int index = spec.substr(0, 7) == "vulkan:" ? parse_index(spec.substr(7)) : -1;
  if (index < 0) return usage;
  return DeviceSpec{Device::kVulkan, index};
}

Result<DeviceSpec> parse_rank_device(std::string_view spec, int local_rank) {
  if (spec == "vulkan") return DeviceSpec{Device::kVulkan, local_rank};
  if (spec.substr(0, 7) != "vulkan:" || spec.find(',') == std::string_view::npos) return parse_device(spec);
  std::vector<int> map;  // local rank -> device index
  for (std::string_view rest = spec.substr(7);;) {
    const size_t comma = rest.find(',');
    const int index = parse_index(rest.substr(0, comma));
    if (index < 0)
      return invalid_argument("--device '" + std::string(spec) + "': a map is vulkan:A,B,... with one device index per "
                              "rank of a host (A for local rank 0, B for 1, ...; indices of `diffucoder devices`)");
    map.push_back(index);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (local_rank >= static_cast<int>(map.size()))
    return invalid_argument("--device '" + std::string(spec) + "': no device for local rank " + std::to_string(local_rank) +
                            " (the map names " + std::to_string(map.size()) + "; give one index per rank of the host)");
  return DeviceSpec{Device::kVulkan, map[static_cast<size_t>(local_rank)]};
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
