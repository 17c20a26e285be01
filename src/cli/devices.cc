// `diffucoder devices [--json]`: the devices the engine can run on — the CPU (the reference backend) and
// every Vulkan device with the properties the Vulkan backend cares about. Without a Vulkan driver or
// loader the CPU is still listed and the Vulkan line says what is missing (exit 0: the CPU works).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "ops/cpu/kernels.h"
#include "ops/vulkan/runtime.h"

namespace dc::cli {
namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

int run_devices(bool json) {
  const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  const std::string cpu_simd = cpu::cpu_has_amx_bf16() ? "AVX-512 + AVX512_BF16 + AMX-BF16"
                               : cpu::cpu_has_avx512_bf16() ? "AVX-512 + AVX512_BF16"
                               : cpu::cpu_has_avx512()      ? "AVX-512"
                               : cpu::cpu_has_avx2()        ? "AVX2 + FMA"
                                                            : "x86-64 baseline (SSE2)";
  auto devices = vk::list_devices();
  if (json) {
    nlohmann::json j;
    j["cpu"] = {{"device", "cpu"}, {"name", cpu_model_name()}, {"threads", std::thread::hardware_concurrency()},
                {"memory_bytes", ram}, {"kernels", cpu_simd}, {"level", cpu_level_name(cpu_level())}};
    j["vulkan_built"] = vk::compiled_in();
    j["vulkan"] = nlohmann::json::array();
    if (devices.ok()) {
      for (const vk::DeviceInfo& d : *devices)
        j["vulkan"].push_back({{"device", "vulkan:" + std::to_string(d.index)}, {"name", d.name}, {"type", d.type},
                               {"api_version", d.api_version}, {"device_local_bytes", d.device_local_bytes},
                               {"max_buffer_bytes", d.max_buffer_bytes}, {"subgroup_size", d.subgroup_size},
                               {"fp16", d.fp16}, {"int8", d.int8}, {"bf16", d.bf16},
                               {"cooperative_matrix", d.cooperative_matrix}, {"matrix_units", d.matrix_units},
                               {"compute_queue", d.compute_queue}});
    } else {
      j["vulkan_error"] = devices.status().to_string();
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("cpu        %s, %u threads, %.1f GiB RAM, kernels: %s\n", cpu_model_name().c_str(),
              std::thread::hardware_concurrency(), static_cast<double>(ram) / (1 << 30), cpu_simd.c_str());
  if (!devices.ok()) {
    std::printf("vulkan     none: %s\n", devices.status().message().c_str());
    return 0;
  }
  for (const vk::DeviceInfo& d : *devices) {
    std::printf("vulkan:%-3d %s (%s, Vulkan %s)\n", d.index, d.name.c_str(), d.type.c_str(), d.api_version.c_str());
    std::printf("           memory %.1f GiB device-local, largest buffer %.0f MiB, subgroup %u\n",
                static_cast<double>(d.device_local_bytes) / (1 << 30), static_cast<double>(d.max_buffer_bytes) / (1 << 20),
                d.subgroup_size);
    std::printf("           fp16 %s, int8 %s, bf16 %s, cooperative matrix %s (matrix units for the GEMMs: %s)%s\n",
                yes_no(d.fp16).c_str(), yes_no(d.int8).c_str(), yes_no(d.bf16).c_str(), yes_no(d.cooperative_matrix).c_str(),
                yes_no(d.matrix_units).c_str(), d.compute_queue ? "" : " (no compute queue: unusable)");
  }
  return 0;
}

}  // namespace

RunFn add_devices_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the devices: the CPU and every Vulkan device (--device vulkan:N)");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print JSON");
  return [json] { return run_devices(*json); };
}

}  // namespace dc::cli
