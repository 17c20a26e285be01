// The kernels' feature checks over core's cpu_level() (core/cpu_level.cc): the AVX-512 fast kernels
// (*_fast.cc, target attributes), else the portable kernels' AVX2 + FMA variant, else their baseline variant
// (core/kernel_variant.h, kernels_avx2.cc).
#include "ops/cpu/kernels.h"

namespace dc::cpu {

bool cpu_has_avx2() { return cpu_level() >= CpuLevel::kAvx2; }
bool cpu_has_avx512() { return cpu_level() >= CpuLevel::kAvx512; }
bool cpu_has_avx512_bf16() { return cpu_level() >= CpuLevel::kAvx512Bf16; }
bool cpu_has_amx_bf16() { return cpu_level() >= CpuLevel::kAmx; }

void force_portable_kernels_for_testing(bool on) {
  set_cpu_level_cap_for_testing(on ? CpuLevel::kAvx2 : CpuLevel::kNative);
}

}  // namespace dc::cpu
