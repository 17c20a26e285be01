// Quantized matmul_nt (q8 / q4 weights): the fast kernels against the reference kernel on odd sizes and
// tails with 1 and 3 threads, and the dequantization of WeightView::row_to_f32. Their speed at the
// DiffuCoder-7B shapes is bench/kernels/quant_bench.cc (docs/bench.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/quant.h"
#include "kernel_test_util.h"
#include "quant_holder.h"
#include "ops/matmul.h"

namespace dc {
namespace {

// The kernels' per-thread block buffers for the direct kernel calls below.
Workspace& scratch() {
  static Workspace ws;
  return ws;
}

using cpu::QuantKernel;
using dc::testing::PackedCopy;
using dc::testing::QuantHolder;
using dc::testing::random_x;

struct Shape {
  int64_t n, m, k, group;
};

const std::vector<Shape> kQ8Shapes = {{1, 1, 32, 0},   {1, 17, 7, 0},    {3, 5, 33, 0},   {5, 33, 100, 0},
                                      {4, 32, 64, 0},  {13, 70, 128, 0}, {17, 47, 96, 0}, {9, 64, 2100, 0}};
const std::vector<Shape> kQ4Shapes = {{1, 1, 32, 32},  {3, 5, 64, 32},    {4, 32, 96, 32}, {13, 70, 160, 32},
                                      {6, 33, 128, 64}, {17, 47, 256, 128}, {9, 64, 2112, 32}, {2, 3, 48, 16},
                                      {5, 40, 1472, 64}, {3, 40, 512, 256},  // 1472: 11.5 x blocks
                                      {4, 40, 768, 384}, {3, 9, 480, 96}};   // 96: the portable kernel

class QuantMatmulTest : public ::testing::TestWithParam<int> {
 protected:
  QuantMatmulTest() : pool_(GetParam()) {}
  ThreadPool pool_;
};

// The fast kernels against the reference: the f32 one to rounding, the int8 one within the bound its
// activation rounding implies, |Δy| ≤ Σ_blocks amax(x_block)/254 · Σ_block |w| (+ f32 slack), over its
// blocks of kInt8XBlock columns.
void check_kernels(ThreadPool* pool, WeightQuant quant, const Shape& s) {
  const QuantHolder w(quant, s.m, s.k, s.group, 7 + s.n + s.m + s.k);
  const auto x = random_x(s.n, s.k, 11 + s.k);
  std::vector<float> bias(s.m);
  for (int64_t j = 0; j < s.m; ++j) bias[j] = 0.1f * static_cast<float>(j % 7) - 0.3f;
  std::vector<float> ref(s.n * s.m, NAN), y(s.n * s.m, NAN);
  cpu::matmul_nt_quant(pool, scratch(), x.data(), s.n, w.view, bias.data(), ref.data(), QuantKernel::kReference);
  for (int64_t i = 0; i < s.n; ++i)  // the reference against the dense values, in double
    for (int64_t j = 0; j < s.m; ++j) {
      double acc = bias[j];
      for (int64_t t = 0; t < s.k; ++t) acc += static_cast<double>(x[i * s.k + t]) * w.dense[j * s.k + t];
      ASSERT_NEAR(ref[i * s.m + j], acc, 1e-5 * (1 + std::abs(acc))) << "reference y[" << i << ", " << j << "]";
    }
  for (QuantKernel kernel : {QuantKernel::kDequantF32, QuantKernel::kInt8Vnni, QuantKernel::kAuto}) {
    std::fill(y.begin(), y.end(), NAN);
    cpu::matmul_nt_quant(pool, scratch(), x.data(), s.n, w.view, bias.data(), y.data(), kernel);
    const bool exact_x = kernel == QuantKernel::kDequantF32 || !cpu::int8_kernel_supports(w.view);
    for (int64_t i = 0; i < s.n; ++i)
      for (int64_t j = 0; j < s.m; ++j) {
        double abs_dot = 0, bound = 0;
        constexpr int64_t kB = cpu::kInt8XBlock;
        for (int64_t b = 0; b * kB < s.k; ++b) {
          double amax = 0, wsum = 0;
          for (int64_t t = b * kB; t < std::min(s.k, b * kB + kB); ++t) {
            amax = std::max(amax, static_cast<double>(std::abs(x[i * s.k + t])));
            wsum += std::abs(w.dense[j * s.k + t]);
            abs_dot += std::abs(x[i * s.k + t] * w.dense[j * s.k + t]);
          }
          bound += amax / 254 * wsum;
        }
        const double tol = (exact_x ? 0 : bound) + 2e-6 * (abs_dot + std::abs(bias[j])) + 1e-6;
        ASSERT_NEAR(y[i * s.m + j], ref[i * s.m + j], tol)
            << "kernel " << static_cast<int>(kernel) << " n " << s.n << " m " << s.m << " k " << s.k << " group "
            << s.group << " at y[" << i << ", " << j << "]";
      }
  }
}

TEST_P(QuantMatmulTest, Q8FastKernelsMatchReference) {
  for (const Shape& s : kQ8Shapes) check_kernels(&pool_, WeightQuant::kQ8, s);
}

TEST_P(QuantMatmulTest, Q4FastKernelsMatchReference) {
  for (const Shape& s : kQ4Shapes) check_kernels(&pool_, WeightQuant::kQ4, s);
}

// kPanels (packed once, as Model::pack_weights does): every row reads back exactly, and every kernel
// gives bit for bit what it gives on the row-major weight.
void check_packed(ThreadPool* pool, WeightQuant quant, const Shape& s) {
  const QuantHolder w(quant, s.m, s.k, s.group, 3 + s.n + s.m + s.k);
  ASSERT_GT(panel_sizes(w.view).panels, 0);
  const PackedCopy copy(pool, w.view);
  const WeightView& packed = copy.view;
  const std::string what = "n " + std::to_string(s.n) + " m " + std::to_string(s.m) + " k " + std::to_string(s.k);
  std::vector<float> row(s.k), row_packed(s.k);
  for (int64_t r = 0; r < s.m; ++r) {
    w.view.row_to_f32(r, row.data());
    packed.row_to_f32(r, row_packed.data());
    ASSERT_EQ(row, row_packed) << what << " row " << r;
  }
  const auto x = random_x(s.n, s.k, 5 + s.k);
  for (QuantKernel kernel : {QuantKernel::kReference, QuantKernel::kDequantF32, QuantKernel::kInt8Vnni}) {
    std::vector<float> want(s.n * s.m, NAN), got(s.n * s.m, NAN);
    cpu::matmul_nt_quant(pool, scratch(), x.data(), s.n, w.view, nullptr, want.data(), kernel);
    cpu::matmul_nt_quant(pool, scratch(), x.data(), s.n, packed, nullptr, got.data(), kernel);
    ASSERT_EQ(want, got) << what << " kernel " << static_cast<int>(kernel);
  }
}

TEST_P(QuantMatmulTest, PackedPanelsGiveTheSameResults) {
  if (!cpu::cpu_has_avx512_vnni()) GTEST_SKIP() << "kPanels for quantized weights needs AVX-512 VNNI";
  for (const Shape& s : kQ8Shapes) check_packed(&pool_, WeightQuant::kQ8, s);
  for (const Shape& s : kQ4Shapes)
    if (s.group % 32 == 0) check_packed(&pool_, WeightQuant::kQ4, s);
}

TEST_P(QuantMatmulTest, PortableFallbackMatchesReference) {
  cpu::force_portable_kernels_for_testing(true);
  EXPECT_FALSE(cpu::cpu_has_avx512_vnni());
  check_kernels(&pool_, WeightQuant::kQ8, {5, 33, 100, 0});
  check_kernels(&pool_, WeightQuant::kQ4, {6, 33, 128, 64});
  cpu::force_portable_kernels_for_testing(false);
}

TEST_P(QuantMatmulTest, FrontEndDispatchesQuantizedWeights) {
  const QuantHolder w(WeightQuant::kQ4, 40, 96, 32, 3);
  const auto x = random_x(6, 96, 4);
  std::vector<float> got(6 * 40), ref(6 * 40);
  Context ctx{Device::kCpu, &pool_};
  matmul_nt(ctx, x.data(), 6, w.view, nullptr, got.data());
  cpu::matmul_nt_quant(&pool_, scratch(), x.data(), 6, w.view, nullptr, ref.data(), QuantKernel::kAuto);
  EXPECT_EQ(got, ref);
  ctx.reference_kernels = true;
  matmul_nt(ctx, x.data(), 6, w.view, nullptr, got.data());
  cpu::matmul_nt_quant(&pool_, scratch(), x.data(), 6, w.view, nullptr, ref.data(), QuantKernel::kReference);
  EXPECT_EQ(got, ref);
}

INSTANTIATE_TEST_SUITE_P(Threads, QuantMatmulTest, ::testing::Values(1, 3));

TEST(QuantMatmul, ResultDoesNotDependOnThreadCount) {
  for (WeightQuant quant : {WeightQuant::kQ8, WeightQuant::kQ4}) {
    const QuantHolder w(quant, 150, 320, 32, 9);
    const auto x = random_x(11, 320, 10);
    std::vector<float> one(11 * 150), three(11 * 150);
    ThreadPool p1(1), p3(3);
    for (QuantKernel kernel : {QuantKernel::kDequantF32, QuantKernel::kInt8Vnni}) {
      cpu::matmul_nt_quant(&p1, scratch(), x.data(), 11, w.view, nullptr, one.data(), kernel);
      cpu::matmul_nt_quant(&p3, scratch(), x.data(), 11, w.view, nullptr, three.data(), kernel);
      EXPECT_EQ(one, three) << "kernel " << static_cast<int>(kernel);
    }
  }
}

TEST(QuantMatmul, RowToF32Dequantizes) {
  for (WeightQuant quant : {WeightQuant::kQ8, WeightQuant::kQ4}) {
    const QuantHolder w(quant, 5, 64, 32, 12);
    std::vector<float> row(64);
    for (int64_t r = 0; r < 5; ++r) {
      w.view.row_to_f32(r, row.data());
      for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(row[c], w.dense[r * 64 + c]) << "row " << r << " col " << c;
    }
  }
}

}  // namespace
}  // namespace dc
