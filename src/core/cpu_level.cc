// Run-time CPU feature checks (cached) behind cpu_level(). The build itself targets the x86-64 baseline
// unless DC_NATIVE=ON (docs/dependencies.md "Build options"), so one binary or wheel runs on any x86-64 and
// still takes the fastest kernels the CPU has. DC_CPU_LEVEL caps the level (the tests and benchmarks of the
// slower paths on a faster machine).
#include "core/cpu_level.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <string>

namespace dc {
namespace {

constexpr std::array<const char*, 6> kLevelNames = {"baseline", "avx2", "avx512", "avx512bf16", "amx", "native"};

// -1: no cap from set_cpu_level_cap_for_testing.
std::atomic<int> g_test_cap{-1};

// F16C is CPUID.1:ECX bit 29 (read directly: clang 14's __builtin_cpu_supports does not know "f16c").
bool detect_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool detect_avx512() {
  __builtin_cpu_init();
  return detect_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && detect_f16c();
}

// AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24, 22), and Linux's permission for this process to use
// the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; Linux >= 5.16).
bool detect_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuLevel detect_level() {
  if (!detect_avx2()) return CpuLevel::kBaseline;
  if (!detect_avx512()) return CpuLevel::kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return CpuLevel::kAvx512;
  return detect_amx_bf16() ? CpuLevel::kAmx : CpuLevel::kAvx512Bf16;
}

// DC_CPU_LEVEL's cap, read once; an unusable value caps at the baseline (check_cpu_level_env reports it).
CpuLevel env_cap() {
  static const CpuLevel cap = [] {
    const char* v = std::getenv("DC_CPU_LEVEL");
    if (v == nullptr || *v == '\0') return CpuLevel::kNative;
    const Result<CpuLevel> parsed = parse_cpu_level(v);
    return parsed.ok() ? parsed.value() : CpuLevel::kBaseline;
  }();
  return cap;
}

}  // namespace

Result<CpuLevel> parse_cpu_level(std::string_view name) {
  for (size_t i = 0; i < kLevelNames.size(); ++i)
    if (name == kLevelNames[i]) return static_cast<CpuLevel>(i);
  return invalid_argument("DC_CPU_LEVEL=" + std::string(name) +
                          ": expected one of baseline, avx2, avx512, avx512bf16, amx, native");
}

const char* cpu_level_name(CpuLevel level) { return kLevelNames[static_cast<size_t>(level)]; }

Status check_cpu_level_env() {
  const char* v = std::getenv("DC_CPU_LEVEL");
  if (v == nullptr || *v == '\0') return Status();
  const Result<CpuLevel> parsed = parse_cpu_level(v);
  return parsed.ok() ? Status() : parsed.status();
}

CpuLevel cpu_detected_level() {
  static const CpuLevel level = detect_level();
  return level;
}

CpuLevel cpu_level() {
  CpuLevel level = std::min(cpu_detected_level(), env_cap());
  const int test_cap = g_test_cap.load(std::memory_order_relaxed);
  if (test_cap >= 0) level = std::min(level, static_cast<CpuLevel>(test_cap));
  return level;
}

void set_cpu_level_cap_for_testing(CpuLevel cap) { g_test_cap.store(static_cast<int>(cap)); }

}  // namespace dc
