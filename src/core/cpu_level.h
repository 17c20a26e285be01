// The run-time CPU level every layer's dispatched kernels read (ops/cpu's portable and fast kernels, the
// sampler's row loops): detected once, capped by DC_CPU_LEVEL or a test hook. The variants themselves come
// from core/kernel_variant.h.
#pragma once

#include <string_view>

#include "core/status.h"

namespace dc {

// Run-time CPU features (cached after the first call), as ordered levels: each includes the ones below.
// kAvx2: AVX2 + FMA; kAvx512: AVX-512 F, BW, VL, DQ (+ AVX2, FMA, F16C); kAvx512Bf16: plus AVX512_BF16;
// kAmx: plus AMX-TILE / AMX-BF16 with the OS's leave to use the tiles. kNative: no cap (DC_CPU_LEVEL=native).
enum class CpuLevel : int { kBaseline, kAvx2, kAvx512, kAvx512Bf16, kAmx, kNative };
CpuLevel cpu_detected_level();  // what the CPU (and the OS, for AMX) offers
// The level the kernels use: the detected one, capped by the environment variable DC_CPU_LEVEL (baseline,
// avx2, avx512, avx512bf16, amx or native; read once; an unknown value caps at baseline, and
// check_cpu_level_env says why) and by set_cpu_level_cap_for_testing. Thread-safe.
CpuLevel cpu_level();
Result<CpuLevel> parse_cpu_level(std::string_view name);  // the names above; an error names DC_CPU_LEVEL
const char* cpu_level_name(CpuLevel level);
Status check_cpu_level_env();  // DC_CPU_LEVEL unset or valid; else the error (for the CLI and Python)
// Tests only (not thread-safe against running kernels): cap the level (kNative: no cap).
void set_cpu_level_cap_for_testing(CpuLevel cap);

}  // namespace dc
