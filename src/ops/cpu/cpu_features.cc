// Run-time CPU feature checks (cached) that pick the fast kernels. They guard only the kernels: with
// DC_NATIVE ON (the default) the whole binary is compiled with -march=native and so needs the build
// machine's instruction set anyway; build with -DDC_NATIVE=OFF for a binary that runs on any x86-64.
#include <atomic>

#include "ops/cpu/kernels.h"

namespace dc::cpu {
namespace {

std::atomic<bool> g_force_portable{false};

bool detect_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

}  // namespace

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
