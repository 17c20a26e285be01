// One source compiled into several instruction-set variants, chosen at run time by cpu_level()
// (core/cpu_level.h). A file's kernels are written once between DC_KERNEL_VARIANT_BEGIN and _END: as
// itself, for the build's baseline (x86-64 unless DC_NATIVE), they land in namespace `baseline` (inside the
// file's own namespace); a second file that defines DC_KERNEL_AVX2 (or DC_KERNEL_AVX512) and includes the
// first compiles them again into namespace `avx2` for AVX2 + FMA (`avx512`: AVX-512 F, BW, VL, DQ as well)
// through #pragma GCC target (lambdas included; templates and inline functions of headers, included above
// BEGIN, keep the baseline, so no wider copy of a shared inline function can reach a baseline caller). A
// dispatcher calls one variant by cpu_level(): ops/cpu/portable_dispatch.cc (the portable kernels,
// kernels_avx2.cc), sampler/row_kernels.cc (the sampler's row loops, row_kernels_avx2.cc / _avx512.cc).
// GCC contracts a*b+c into an FMA where the target has one: a variant that must give the baseline's bits is
// compiled with -ffp-contract=off (CMakeLists.txt).
#pragma once

// (_Pragma takes one string literal, so each variant spells its target in full.)
#if defined(DC_KERNEL_AVX512) && defined(__clang__)
#define DC_KERNEL_VARIANT_BEGIN                                                                            \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq\"))), \
          apply_to = function)") namespace avx512 {
#define DC_KERNEL_VARIANT_END } _Pragma("clang attribute pop")
#elif defined(DC_KERNEL_AVX512)
#define DC_KERNEL_VARIANT_BEGIN                                                                      \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq\")") \
      namespace avx512 {
#define DC_KERNEL_VARIANT_END } _Pragma("GCC pop_options")
#elif defined(DC_KERNEL_AVX2) && defined(__clang__)
#define DC_KERNEL_VARIANT_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)") namespace avx2 {
#define DC_KERNEL_VARIANT_END } _Pragma("clang attribute pop")
#elif defined(DC_KERNEL_AVX2)
#define DC_KERNEL_VARIANT_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")") namespace avx2 {
#define DC_KERNEL_VARIANT_END } _Pragma("GCC pop_options")
#else
#define DC_KERNEL_VARIANT_BEGIN namespace baseline {
#define DC_KERNEL_VARIANT_END }
#endif
