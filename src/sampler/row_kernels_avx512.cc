// The sampler's row loops again, compiled for AVX-512 into dc::row_kernels::avx512 (core/kernel_variant.h;
// without FMA contraction in a portable build, CMakeLists.txt, so they give the baseline's bits).
#define DC_KERNEL_AVX512 1
#include "sampler/row_kernels.cc"
