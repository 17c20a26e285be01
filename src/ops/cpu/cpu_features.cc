// Run-time CPU feature checks (cached) that pick the fast kernels. They guard only the kernels: with
// DC_NATIVE ON (the default) the whole binary is compiled with -march=native and so needs the build
// machine's instruction set anyway; build with -DDC_NATIVE=OFF for a binary that runs on any x86-64.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "ops/cpu/kernels.h"

namespace dc::cpu {
namespace {

std::atomic<bool> g_force_portable{false};

// F16C is CPUID.1:ECX bit 29 (read directly: clang 14's __builtin_cpu_supports does not know "f16c").
bool detect_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

bool detect_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("fma") && detect_f16c();
}

// AMX-TILE and AMX-BF16 (CPUID.(7,0):EDX bits 24, 22), and Linux's permission for this process to use
// the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; Linux >= 5.16).
bool detect_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

bool cpu_has_amx_bf16() {
  static const bool has = detect_avx512() && __builtin_cpu_supports("avx512bf16") && detect_amx_bf16();
  return has && !g_force_portable.load(std::memory_order_relaxed);
}

bool cpu_has_avx512() {
  static const bool has = detect_avx512();
  return has && !g_force_portable.load(std::memory_order_relaxed);
}

bool cpu_has_avx512_bf16() {
  static const bool has = detect_avx512() && __builtin_cpu_supports("avx512bf16");
  return has && !g_force_portable.load(std::memory_order_relaxed);
}

void force_portable_kernels_for_testing(bool on) { g_force_portable.store(on); }

}  // namespace dc::cpu
