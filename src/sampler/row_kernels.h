// The sampler's loops over a whole vocabulary row (filters.cc's hot passes), compiled for the x86-64 baseline,
// for AVX2 + FMA and for AVX-512 (core/kernel_variant.h: row_kernels.cc as itself, row_kernels_avx2.cc,
// row_kernels_avx512.cc) and called by cpu_level(). Every variant gives the baseline's bits: the wider ones
// are compiled without FMA contraction (CMakeLists.txt), and each loop's result does not depend on the
// vector width (see each function).
#pragma once

#include <cstdint>

namespace dc::row_kernels {

// exp(x) for x <= 0 within 2 ulp, branch-free (see row_kernels.cc); exp(−inf) = 0 exactly (a filtered or
// banned token has probability 0). The baseline's code: for the scalar callers of filters.cc.
float exp_or_zero(float x);

// Divides x[0, n) by t in place when `divide`; returns the max and sets `bad` iff a value is NaN or +inf.
float scan_row(float* x, int64_t n, bool divide, float t, bool& bad);

// Σ exp(x_i − max) over x[0, n), the terms in f32, summed in f64 over 16 lanes added in a fixed order.
double sum_exp(const float* x, int64_t n, float max);

// Whether any of x[0, n) is > v.
bool any_greater(const float* x, int64_t n, float v);

// probs[i] = exp_or_zero(x[ids[i]] − max) (x[i] when ids is null) for i in [0, m); returns their sum in f64,
// added in index order.
double exp_rows(const float* x, const int32_t* ids, int64_t m, float max, float* probs);

// probs[i] = float(probs[i] / z) for i in [0, m).
void normalize(float* probs, int64_t m, double z);

}  // namespace dc::row_kernels
