// The portable kernels (the reference kernels of kernels.h / backward_kernels.h: matmul.cc, attention.cc,
// attention_window.cc, attention_backward.cc, elementwise.cc, elementwise_backward.cc, loss.cc) again, every
// function compiled for AVX2 + FMA into namespace dc::cpu::avx2 (core/kernel_variant.h; as themselves they
// are dc::cpu::baseline); portable_dispatch.cc calls them when cpu_level() >= CpuLevel::kAvx2.
#define DC_KERNEL_AVX2 1
#include "ops/cpu/attention.cc"
#include "ops/cpu/attention_backward.cc"
#include "ops/cpu/attention_window.cc"
#include "ops/cpu/elementwise.cc"
#include "ops/cpu/elementwise_backward.cc"
#include "ops/cpu/loss.cc"
#include "ops/cpu/matmul.cc"
