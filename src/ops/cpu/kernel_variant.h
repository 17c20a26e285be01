// The portable kernels (the reference kernels of kernels.h / backward_kernels.h: matmul.cc, attention.cc,
// attention_window.cc, attention_backward.cc, elementwise.cc, elementwise_backward.cc, loss.cc) are compiled
// twice. As themselves, for the build's baseline (x86-64 unless DC_NATIVE), into namespace dc::cpu::baseline;
// and again by kernels_avx2.cc, which defines DC_KERNEL_AVX2 and includes them, into dc::cpu::avx2 with every
// function between DC_KERNEL_VARIANT_BEGIN and _END compiled for AVX2 + FMA (#pragma GCC target: lambdas
// included; templates and inline functions of headers, included above BEGIN, keep the baseline, so no
// AVX2 copy of a shared inline function can reach a baseline caller). portable_dispatch.cc defines the
// kernels.h names, which call one or the other by cpu_level() (cpu_features.cc).
#pragma once

#if defined(DC_KERNEL_AVX2) && defined(__clang__)
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
