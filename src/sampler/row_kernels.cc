// The sampler's row loops (row_kernels.h), written once between DC_KERNEL_VARIANT_BEGIN / _END: as this
// file, the baseline variant dc::row_kernels::baseline and the dispatch by cpu_level(); included by
// row_kernels_avx2.cc / _avx512.cc, the wider variants.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/cpu_level.h"
#include "core/kernel_variant.h"
#include "sampler/row_kernels.h"

namespace dc::row_kernels {
DC_KERNEL_VARIANT_BEGIN
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// exp(x) for x <= 0 (x = logit − max) within 2 ulp of the correctly rounded value, branch-free so that
// loops over the vocabulary vectorise (libm's expf does not). exp(x) = 2^k · exp(r), |r| <= ln2/2, with
// Cephes' degree-6 polynomial. Below −87 the result is clamped to about 1e-38 instead of a denormal
// or 0: negligible next to the max term (1). −inf gives that tiny value too, so callers must not rely
// on −inf → 0 here (the survivor softmax uses exp_or_zero).
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  // Round to nearest with the 1.5·2^23 trick (std::floor and std::max keep GCC from vectorising).
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float exp_or_zero_inline(float x) { return x == -kInf ? 0.0f : exp_nonpositive(x); }

// An OpenMP simd reduction so that the loop vectorises: one running max is a chain the compiler must
// otherwise keep in order, and a scalar division per token costs more than the row's other passes
// together. The sum of (v − v) over the values other than −inf (a banned token) is NaN iff one was NaN
// or +inf, and exactly 0 otherwise, in any order. The max of a set is the same in any order (a ±0 tie
// aside, which no caller can tell apart) and x / t is the same IEEE division either way, so the results
// equal a scalar loop's at any vector width.
template <bool kDivide>
float scan(float* x, int64_t n, float t, bool& bad) {
  float max = -kInf, nan_sum = 0.0f;
#pragma omp simd reduction(max : max) reduction(+ : nan_sum)
  for (int64_t i = 0; i < n; ++i) {
    const float v = kDivide ? x[i] / t : x[i];
    x[i] = v;
    nan_sum += v == -kInf ? 0.0f : v - v;
    max = v > max ? v : max;
  }
  bad = std::isnan(nan_sum);
  return max;
}

// out[j] = exp_or_zero(x[ids[j]] − max) (x[j] without kGather): one element per lane, any width.
template <bool kGather>
void exp_block(const float* x, const int32_t* ids, int64_t len, float max, float* out) {
  for (int64_t j = 0; j < len; ++j) out[j] = exp_or_zero_inline(x[kGather ? ids[j] : j] - max);
}

}  // namespace

float exp_or_zero(float x) { return exp_or_zero_inline(x); }

float scan_row(float* x, int64_t n, bool divide, float t, bool& bad) {
  return divide ? scan<true>(x, n, t, bad) : scan<false>(x, n, 1.0f, bad);
}

// The terms a block at a time (a loop that vectorises); the 16 f64 lanes are 16 separate running sums, so
// a vector of them adds exactly what the scalar loop adds.
double sum_exp(const float* x, int64_t n, float max) {
  constexpr int64_t kBlock = 512, kLanes = 16;
  float terms[kBlock];
  double lanes[kLanes] = {};
  double tail = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    exp_block<false>(x + start, nullptr, len, max, terms);
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += terms[j + l];
    }
    for (; j < len; ++j) tail += terms[j];
  }
  double z = tail;
  for (double lane : lanes) z += lane;
  return z;
}

bool any_greater(const float* x, int64_t n, float v) {
  int any = 0;
#pragma omp simd reduction(| : any)
  for (int64_t j = 0; j < n; ++j) any |= x[j] > v;
  return any != 0;
}

// The exponentials a block at a time (vectorised), then their f64 sum in index order (a chain no variant
// reorders).
double exp_rows(const float* x, const int32_t* ids, int64_t m, float max, float* probs) {
  constexpr int64_t kBlock = 512;
  double z = 0.0;
  for (int64_t start = 0; start < m; start += kBlock) {
    const int64_t len = std::min(kBlock, m - start);
    float* out = probs + start;
    if (ids != nullptr) exp_block<true>(x, ids + start, len, max, out);
    else exp_block<false>(x + start, nullptr, len, max, out);
    for (int64_t j = 0; j < len; ++j) z += out[j];
  }
  return z;
}

void normalize(float* probs, int64_t m, double z) {
  for (int64_t i = 0; i < m; ++i) probs[i] = static_cast<float>(probs[i] / z);
}

DC_KERNEL_VARIANT_END

#if !defined(DC_KERNEL_AVX2) && !defined(DC_KERNEL_AVX512)
// The wider variants (row_kernels_avx2.cc, row_kernels_avx512.cc), declared with the type of the
// row_kernels.h declaration (so a variant whose signature drifts does not link).
#define DC_DECLARE_VARIANTS(name)             \
  namespace avx2 {                            \
  decltype(::dc::row_kernels::name) name;     \
  }                                           \
  namespace avx512 {                          \
  decltype(::dc::row_kernels::name) name;     \
  }
DC_DECLARE_VARIANTS(scan_row)
DC_DECLARE_VARIANTS(sum_exp)
DC_DECLARE_VARIANTS(any_greater)
DC_DECLARE_VARIANTS(exp_rows)
DC_DECLARE_VARIANTS(normalize)
#undef DC_DECLARE_VARIANTS

// One load and compare per call, against a pass over a row.
#define DC_DISPATCH(name, ...)                                         \
  const CpuLevel level = cpu_level();                                  \
  if (level >= CpuLevel::kAvx512) return avx512::name(__VA_ARGS__);    \
  if (level >= CpuLevel::kAvx2) return avx2::name(__VA_ARGS__);        \
  return baseline::name(__VA_ARGS__)

float exp_or_zero(float x) { return baseline::exp_or_zero(x); }
float scan_row(float* x, int64_t n, bool divide, float t, bool& bad) { DC_DISPATCH(scan_row, x, n, divide, t, bad); }
double sum_exp(const float* x, int64_t n, float max) { DC_DISPATCH(sum_exp, x, n, max); }
bool any_greater(const float* x, int64_t n, float v) { DC_DISPATCH(any_greater, x, n, v); }
double exp_rows(const float* x, const int32_t* ids, int64_t m, float max, float* probs) {
  DC_DISPATCH(exp_rows, x, ids, m, max, probs);
}
void normalize(float* probs, int64_t m, double z) { DC_DISPATCH(normalize, probs, m, z); }
#undef DC_DISPATCH
#endif

}  // namespace dc::row_kernels
