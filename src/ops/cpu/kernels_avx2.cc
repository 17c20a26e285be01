// The portable kernels again, every function compiled for AVX2 + FMA into namespace dc::cpu::avx2
// (kernel_variant.h); portable_dispatch.cc calls them when cpu_level() >= CpuLevel::kAvx2.
#define DC_KERNEL_AVX2 1
#include "ops/cpu/attention.cc"
#include "ops/cpu/attention_backward.cc"
#include "ops/cpu/attention_window.cc"
#include "ops/cpu/elementwise.cc"
#include "ops/cpu/elementwise_backward.cc"
#include "ops/cpu/loss.cc"
#include "ops/cpu/matmul.cc"
