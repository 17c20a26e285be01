// Quantized matmul_nt (q8 / q4 weights): the fast kernels against the reference kernel on odd sizes and
// tails with 1 and 3 threads, the dequantization of WeightView::row_to_f32, and (disabled by default)
// the speed at the DiffuCoder-7B shapes against the bf16 kernel:
//   build-q/tests/test_ops --gtest_also_run_disabled_tests --gtest_filter='*QuantBench*'
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/quant.h"
#include "kernel_test_util.h"
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

// A random quantized weight: codes over the whole range, positive scales, q4 mins of either sign.
struct QuantHolder {
  std::vector<uint8_t> codes;
  std::vector<float> scales32;
  std::vector<uint16_t> scales16, mins16;
  WeightView view;
  std::vector<float> dense;  // [rows, cols] the values the codes stand for

  QuantHolder(WeightQuant quant, int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.002f, 0.02f), mn(-0.15f, 0.05f);
    view.rows = rows;
    view.cols = cols;
    view.quant = quant;
    if (quant == WeightQuant::kQ8) {
      codes.resize(rows * cols);
      for (auto& c : codes) c = static_cast<uint8_t>(static_cast<int8_t>(byte(gen) % 255 - 127));
      scales32.resize(rows);
      for (auto& s : scales32) s = scale(gen);
      view.dtype = DType::kI8;
      view.scales = scales32.data();
    } else {
      codes.resize(rows * cols / 2);
      for (auto& c : codes) c = static_cast<uint8_t>(byte(gen));
      scales16.resize(rows * cols / group);
      mins16.resize(rows * cols / group);
      for (auto& s : scales16) s = f32_to_f16(scale(gen));
      for (auto& m : mins16) m = f32_to_f16(mn(gen));
      view.dtype = DType::kU8;
      view.scales = scales16.data();
      view.mins = mins16.data();
      view.group_size = group;
    }
    view.data = codes.data();
    dense.resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        if (quant == WeightQuant::kQ8) {
          dense[r * cols + c] = scales32[r] * static_cast<float>(static_cast<int8_t>(codes[r * cols + c]));
        } else {
          const uint8_t b = codes[(r * cols + c) / 2];
          const int q = c % 2 == 0 ? (b & 15) : (b >> 4);
          const int64_t g = r * (cols / group) + c / group;
          dense[r * cols + c] = f16_to_f32(scales16[g]) * static_cast<float>(q) + f16_to_f32(mins16[g]);
        }
      }
  }
};

std::vector<float> random_x(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n * k);
  for (auto& x : v) x = dist(gen);
  if (!v.empty()) v[v.size() / 3] = 25.0f;  // an outlier, as real activations have
  return v;
}

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

// ---- speed at the 7B shapes (disabled: run by hand) ------------------------------------------------

double best_ms(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Kernels interleaved round by round (the best of the rounds counts), so that a noisy machine slows
// them alike. DC_BENCH_THREADS sets the threads (default: all), DC_BENCH_ROUNDS the rounds, DC_BENCH_N the
// rows of x (default 33 and 320), DC_BENCH_KM=k,m one shape, DC_BENCH_QUICK=1 times only the kPanels
// kernels. q4 at the default group size 128 and at 32.
TEST(QuantBench, DISABLED_SevenBShapes) {
  ThreadPool pool(std::getenv("DC_BENCH_THREADS") ? std::atoi(std::getenv("DC_BENCH_THREADS")) : 0);
  std::printf("threads %d, vnni %d\n", pool.n_threads(), cpu::cpu_has_avx512_vnni() ? 1 : 0);
  std::vector<std::pair<int64_t, int64_t>> shapes = {{3584, 18944}, {18944, 3584}};  // (k, m)
  if (const char* e = std::getenv("DC_BENCH_KM")) shapes = {{std::atoll(e), std::atoll(std::strchr(e, ',') + 1)}};
  for (auto [k, m] : shapes) {
    const QuantHolder q8(WeightQuant::kQ8, m, k, 0, 1), q4(WeightQuant::kQ4, m, k, 128, 2),
        q4_32(WeightQuant::kQ4, m, k, 32, 3);
    std::vector<uint16_t> bf16(m * k);
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(q8.dense[i]);
    const WeightView wb{DType::kBF16, bf16.data(), m, k};
    const PackedCopy wb_packed(&pool, wb), q8_packed(&pool, q8.view), q4_packed(&pool, q4.view),
        q4_32_packed(&pool, q4_32.view);
    std::vector<int64_t> ns = {33, 320};  // 33: the rows of a --cache dual step at block length 32
    if (const char* e = std::getenv("DC_BENCH_N")) ns = {std::atoll(e)};
    for (int64_t n : ns) {
      const auto x = random_x(n, k, 5);
      std::vector<float> y(n * m);
      Context f32{Device::kCpu, &pool}, bf{Device::kCpu, &pool};
      bf.matmul_precision = MatmulPrecision::kBF16;
      const std::vector<std::pair<std::string, std::function<void()>>> kernels = {
          {"bf16 weights, f32 activ.", [&] { matmul_nt(f32, x.data(), n, wb, nullptr, y.data()); }},
          {"bf16 weights, bf16 activ.", [&] { matmul_nt(bf, x.data(), n, wb, nullptr, y.data()); }},
          {"bf16 kPanels, bf16 activ.", [&] { matmul_nt(bf, x.data(), n, wb_packed.view, nullptr, y.data()); }},
          {"q8 int8 vnni", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q8.view, nullptr, y.data(), QuantKernel::kInt8Vnni); }},
          {"q4 g128 int8 vnni", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q4.view, nullptr, y.data(), QuantKernel::kInt8Vnni); }},
          {"q8 kPanels int8 vnni", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q8_packed.view, nullptr, y.data(), QuantKernel::kInt8Vnni); }},
          {"q4 g128 kPanels int8 vnni", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q4_packed.view, nullptr, y.data(), QuantKernel::kInt8Vnni); }},
          {"q4 g32 kPanels int8 vnni", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q4_32_packed.view, nullptr, y.data(), QuantKernel::kInt8Vnni); }},
          {"q8 dequant f32 (portable)", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q8.view, nullptr, y.data(), QuantKernel::kDequantF32); }},
          {"q4 dequant f32 (portable)", [&] { cpu::matmul_nt_quant(&pool, scratch(), x.data(), n, q4.view, nullptr, y.data(), QuantKernel::kDequantF32); }},
      };
      std::vector<double> best(kernels.size(), 1e30);
      const int rounds = std::getenv("DC_BENCH_ROUNDS") ? std::atoi(std::getenv("DC_BENCH_ROUNDS")) : 5;
      for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < kernels.size(); ++i) {
          const std::string& name = kernels[i].first;
          if (r >= 2 && name.find("portable") != std::string::npos) continue;  // slow: two rounds
          if (std::getenv("DC_BENCH_QUICK") && name.find("kPanels") == std::string::npos) continue;
          best[i] = std::min(best[i], best_ms(1, kernels[i].second));
        }
      for (size_t i = 0; i < kernels.size(); ++i)
        std::printf("k %5lld m %5lld n %3lld  %-28s %8.2f ms  %6.1f GMAC/s  %5.2fx bf16/f32\n", (long long)k,
                    (long long)m, (long long)n, kernels[i].first.c_str(), best[i], 1e-6 * n * m * k / best[i],
                    best[0] / best[i]);
    }
  }
}

}  // namespace
}  // namespace dc
