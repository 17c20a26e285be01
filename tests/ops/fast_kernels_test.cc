// The fast CPU kernels against the reference kernels (Context::reference_kernels) on random inputs with
// odd sizes and tails, with 1 and 3 threads. Tolerances, relative to the largest reference magnitude:
// f32 paths 1e-5; matmul with bf16-rounded activations 1e-2 (and 1e-5 against the reference run on the
// same rounded activations). The fast kernels must not depend on the thread count (bitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "ops/attention.h"
#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/pack_f16.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/peak.h"

namespace dc {
namespace {

using dc::testing::expect_close;
using dc::testing::random_vec;

struct KernelWeight {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightView view;
};

KernelWeight make_kernel_weight(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  KernelWeight w;
  w.f32 = random_vec(rows * cols, seed, 0.5f);
  if (dtype == DType::kF32) {
    w.view = {dtype, w.f32.data(), rows, cols};
    return w;
  }
  w.half.resize(w.f32.size());
  for (size_t i = 0; i < w.f32.size(); ++i)
    w.half[i] = dtype == DType::kBF16 ? f32_to_bf16(w.f32[i]) : f32_to_f16(w.f32[i]);
  w.view = {dtype, w.half.data(), rows, cols};
  return w;
}

class FastKernelsTest : public ::testing::TestWithParam<int> {
 protected:
  FastKernelsTest() : pool_(GetParam()), one_(1) {
    fast_.pool = &pool_;
    ref_.pool = &pool_;
    ref_.reference_kernels = true;
    bf16_.pool = &pool_;
    bf16_.matmul_precision = MatmulPrecision::kBF16;
    fast1_.pool = &one_;
    bf16_1_.pool = &one_;
    bf16_1_.matmul_precision = MatmulPrecision::kBF16;
  }
  ThreadPool pool_, one_;
  Context fast_, ref_, bf16_, fast1_, bf16_1_;  // *1_: the same on one thread (thread-count invariance)
};

using Mnk = std::tuple<int64_t, int64_t, int64_t>;
// Tails in every direction: n around the 6-row micro-tile and the dot-product path (n <= 8, or <= 32 for
// k <= 1024, in groups of 8 rows), m around the 64-column panel and 16-lane vectors, k around 16/32-element
// vectors, odd k, several k blocks, n > 512.
// The larger ones (>= 2^18 multiply-adds) run on the pool: small-n tasks over W rows, packed tasks over
// rows × panels, conversion blocks shared between tasks.
const Mnk kMatmulShapes[] = {{1, 1, 1},     {1, 17, 33},    {2, 70, 31},    {3, 64, 64},    {4, 129, 200},
                             {5, 7, 3},     {6, 64, 16},    {7, 65, 257},   {13, 70, 128},  {31, 130, 513},
                             {64, 200, 96}, {37, 96, 1030}, {100, 1, 40},   {521, 72, 40},  {1, 2001, 301},
                             {3, 700, 200}, {4, 64, 2100},  {45, 130, 2050}, {12, 70, 1500}, {20, 600, 900}};

TEST_P(FastKernelsTest, MatmulF32PathMatchesReferenceForEveryDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (auto [n, m, k] : kMatmulShapes) {
      const KernelWeight w = make_kernel_weight(dtype, m, k, static_cast<uint32_t>(7 + n + m + k));
      const auto x = random_vec(n * k, static_cast<uint32_t>(11 + k));
      const auto bias = random_vec(m, 5);
      for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
        std::vector<float> want(n * m, NAN), got(n * m, NAN), got1(n * m, NAN);
        matmul_nt(ref_, x.data(), n, w.view, b, want.data());
        matmul_nt(fast_, x.data(), n, w.view, b, got.data());
        matmul_nt(fast1_, x.data(), n, w.view, b, got1.data());
        const std::string what = std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + " m=" +
                                 std::to_string(m) + " k=" + std::to_string(k) + (b ? " bias" : "");
        expect_close(want, got, 1e-5, what);
        ASSERT_EQ(got, got1) << what << ": result depends on the thread count";
      }
    }
  }
}

// bf16 precision over bf16 weights, and over f16 weights (exact, split into bf16 hi + lo: pack_f16.h).
TEST_P(FastKernelsTest, MatmulBf16ActivationsWithinStatedTolerance) {
  if (!cpu::cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512_BF16 (bf16 activations, kPanels)";
  for (DType dtype : {DType::kBF16, DType::kF16})
  for (auto [n, m, k] : kMatmulShapes) {
    const KernelWeight w = make_kernel_weight(dtype, m, k, static_cast<uint32_t>(3 + n + m + k));
    const auto x = random_vec(n * k, static_cast<uint32_t>(17 + k));
    auto x_rounded = x;
    for (float& v : x_rounded) v = bf16_to_f32(f32_to_bf16(v));
    const auto bias = random_vec(m, 6);
    std::vector<float> want(n * m), want_rounded(n * m), got(n * m), got1(n * m);
    matmul_nt(ref_, x.data(), n, w.view, bias.data(), want.data());
    matmul_nt(ref_, x_rounded.data(), n, w.view, bias.data(), want_rounded.data());
    matmul_nt(bf16_, x.data(), n, w.view, bias.data(), got.data());
    matmul_nt(bf16_1_, x.data(), n, w.view, bias.data(), got1.data());
    const std::string what = std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + " m=" + std::to_string(m) +
                             " k=" + std::to_string(k);
    expect_close(want, got, 1e-2, "bf16 activations vs exact, " + what);
    expect_close(want_rounded, got, 1e-5, "bf16 activations vs reference on rounded x, " + what);
    ASSERT_EQ(got, got1) << what << ": result depends on the thread count";
  }
}

// The bf16 kernel's AMX path (k a multiple of 32, n >= 32: 32-row blocks through the tiles, the rest of
// the rows through vdpbf16ps) on row-major and kPanels weights, with bias, accumulation and column
// tails, against the reference on rounded activations; every shape also runs where AMX is absent.
// f16 weights (row-major only) take the same paths with hi and lo panels.
TEST_P(FastKernelsTest, MatmulBf16TileShapes) {
  const Mnk shapes[] = {{32, 64, 32}, {33, 65, 64}, {70, 130, 96}, {100, 200, 1056}, {64, 16, 2048}, {96, 1000, 128}};
  for (DType dtype : {DType::kBF16, DType::kF16})
  for (auto [n, m, k] : shapes) {
    const KernelWeight w = make_kernel_weight(dtype, m, k, static_cast<uint32_t>(n + m + k));
    std::vector<uint32_t> storage;
    WeightView packed;  // bf16 only
    if (dtype == DType::kBF16) {
      const PanelSizes sizes = panel_sizes(w.view);
      storage.resize(static_cast<size_t>(sizes.data_bytes / 4) + 16);
      uint32_t* aligned = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64 / 4;
      packed = pack_panels(bf16_, w.view, aligned, nullptr, nullptr, 0, sizes.panels);
    }
    auto x = random_vec(n * k, static_cast<uint32_t>(19 + k));
    for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));  // already bf16: the reference sees what the kernel does
    const auto bias = random_vec(m, 8), y0 = random_vec(n * m, 4);
    const std::string what = std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + " m=" + std::to_string(m) +
                             " k=" + std::to_string(k);
    std::vector<float> want(n * m), want_add = y0;
    matmul_nt(ref_, x.data(), n, w.view, bias.data(), want.data());
    matmul_nt_add(ref_, x.data(), n, w.view, want_add.data());
    for (const WeightView* view : std::initializer_list<const WeightView*>{&w.view, &packed}) {
      if (view->empty()) continue;
      std::vector<float> got(n * m), got1(n * m), got_add = y0;
      matmul_nt(bf16_, x.data(), n, *view, bias.data(), got.data());
      matmul_nt(bf16_1_, x.data(), n, *view, bias.data(), got1.data());
      matmul_nt_add(bf16_, x.data(), n, *view, got_add.data());
      const std::string layout = view == &packed ? " kPanels" : " row-major";
      expect_close(want, got, 1e-5, what + layout);
      expect_close(want_add, got_add, 1e-5, "add, " + what + layout);
      ASSERT_EQ(got, got1) << what << layout << ": result depends on the thread count";
    }
  }
}

// matmul_nt_add (y += x·wᵀ, the backward's products): the reference adds exactly the matmul_nt result to
// y; the fast kernels (f32 precision; bf16 precision on bf16 weights) match it as matmul_nt does.
TEST_P(FastKernelsTest, MatmulAddSumsIntoY) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (auto [n, m, k] : kMatmulShapes) {
      const KernelWeight w = make_kernel_weight(dtype, m, k, static_cast<uint32_t>(5 + n + m + k));
      const auto x = random_vec(n * k, static_cast<uint32_t>(13 + k)), y0 = random_vec(n * m, 9);
      std::vector<float> product(n * m), want = y0;
      matmul_nt(ref_, x.data(), n, w.view, nullptr, product.data());
      matmul_nt_add(ref_, x.data(), n, w.view, want.data());
      for (int64_t i = 0; i < n * m; ++i) ASSERT_EQ(want[i], y0[i] + product[i]) << "reference, index " << i;
      const std::string what = std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + " m=" +
                               std::to_string(m) + " k=" + std::to_string(k);
      std::vector<float> got = y0, got1 = y0;
      matmul_nt_add(fast_, x.data(), n, w.view, got.data());
      matmul_nt_add(fast1_, x.data(), n, w.view, got1.data());
      expect_close(want, got, 1e-5, "f32 precision, " + what);
      ASSERT_EQ(got, got1) << what << ": result depends on the thread count";
      if (dtype != DType::kBF16 || !cpu::cpu_has_avx512_bf16()) continue;  // bf16 activations: AVX512_BF16
      auto x_rounded = x;
      for (float& v : x_rounded) v = bf16_to_f32(f32_to_bf16(v));
      std::vector<float> want_rounded = y0, got_bf16 = y0;
      matmul_nt_add(ref_, x_rounded.data(), n, w.view, want_rounded.data());
      matmul_nt_add(bf16_, x.data(), n, w.view, got_bf16.data());
      expect_close(want_rounded, got_bf16, 1e-5, "bf16 precision vs reference on rounded x, " + what);
    }
  }
}

// The backward's transposes: the 16×16-block kernels give the reference loops' values exactly (f32, and
// each value rounded by f32_to_bf16).
TEST_P(FastKernelsTest, TransposesMatchTheReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {16, 16}, {17, 33}, {100, 7}, {33, 130}, {256, 896}}) {
    const auto x = random_vec(rows * cols, static_cast<uint32_t>(rows + cols));
    std::vector<float> want(rows * cols), got(rows * cols, NAN);
    cpu::transpose(&pool_, x.data(), rows, cols, want.data());
    cpu::transpose_fast(&pool_, x.data(), rows, cols, got.data());
    ASSERT_EQ(want, got) << rows << "x" << cols;
    if (!cpu::cpu_has_avx512_bf16()) continue;
    std::vector<uint16_t> half(rows * cols, 0xffff);
    cpu::transpose_bf16_fast(&pool_, x.data(), rows, cols, half.data());
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(half[i], f32_to_bf16(want[i])) << rows << "x" << cols << " " << i;
  }
}

// The f16 split (pack_f16.h) on every finite f16 value (64 rows × 1024 columns = all 65536 bit patterns,
// infinities and NaNs replaced by 0): hi is the value rounded to bf16, hi + lo is the value exactly, in
// pack_pairs_bf16's layout.
TEST(PackF16, SplitIsExactForEveryF16Value) {
  if (!cpu::cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512_BF16";
  constexpr int64_t kRows = 64, kCols = 1024;
  std::vector<uint16_t> w(kRows * kCols);
  for (int64_t i = 0; i < kRows * kCols; ++i)
    w[i] = (i & 0x7c00) == 0x7c00 ? 0 : static_cast<uint16_t>(i);  // exponent all ones: inf / NaN
  std::vector<uint32_t> storage(2 * kRows * kCols / 2 + 16);
  uint32_t* hi = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64 / 4;
  uint32_t* lo = hi + kRows * kCols / 2;
  cpu::pack_pairs_f16_split(w.data(), kCols, kRows, 0, kCols, nullptr, hi, lo);
  for (int64_t c = 0; c < kRows; ++c)
    for (int64_t t = 0; t < kCols; ++t) {
      const int64_t word = t / 2 * kPanelRows + c, shift = 16 * (t % 2);
      const uint16_t h = static_cast<uint16_t>(hi[word] >> shift), l = static_cast<uint16_t>(lo[word] >> shift);
      const float value = f16_to_f32(w[c * kCols + t]);
      ASSERT_EQ(h, f32_to_bf16(value)) << "f16 bits " << w[c * kCols + t];
      ASSERT_EQ(bf16_to_f32(h) + bf16_to_f32(l), value) << "f16 bits " << w[c * kCols + t];
    }
}

// kPanels weights: every row reads back exactly; the reference kernel gives the row-major result bit for
// bit; the fast kernel at f32 precision matches the reference and at bf16 precision the reference on
// rounded activations (and the row-major fast result bit for bit where both take the packed path).
TEST_P(FastKernelsTest, MatmulPackedPanelsMatchRowMajor) {
  if (!cpu::cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512_BF16 (bf16 activations, kPanels)";
  for (auto [n, m, k] : kMatmulShapes) {
    const KernelWeight w = make_kernel_weight(DType::kBF16, m, k, static_cast<uint32_t>(9 + n + m + k));
    const dc::testing::PackedCopy p(&pool_, w.view);
    const std::string what = "n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k);
    std::vector<float> row(k), row_packed(k);
    for (int64_t r = 0; r < m; ++r) {
      w.view.row_to_f32(r, row.data());
      p.view.row_to_f32(r, row_packed.data());
      ASSERT_EQ(row, row_packed) << what << " row " << r;
    }
    const int64_t panels = (m + kPanelRows - 1) / kPanelRows;
    for (int64_t i = 0; i < panels * kPanelRows * ((k + 1) / 2); ++i) {
      const int64_t panel_row = i % kPanelRows + i / (kPanelRows * ((k + 1) / 2)) * kPanelRows;
      const int64_t col_pair = i / kPanelRows % ((k + 1) / 2);
      if (panel_row >= m) {
        ASSERT_EQ(p.words()[i], 0u) << what << ": pad row not zero";
      } else if (k % 2 && col_pair == k / 2) {
        ASSERT_EQ(p.words()[i] >> 16, 0u) << what << ": pad column not zero";
      }
    }
    const auto x = random_vec(n * k, static_cast<uint32_t>(19 + k));
    auto x_rounded = x;
    for (float& v : x_rounded) v = bf16_to_f32(f32_to_bf16(v));
    const auto bias = random_vec(m, 8);
    std::vector<float> want(n * m), got(n * m), want_rounded(n * m), got_bf16(n * m), got_bf16_1(n * m),
        row_major_bf16(n * m);
    matmul_nt(ref_, x.data(), n, w.view, bias.data(), want.data());
    matmul_nt(ref_, x.data(), n, p.view, bias.data(), got.data());
    ASSERT_EQ(want, got) << what << ": reference kernel on kPanels";
    matmul_nt(fast_, x.data(), n, p.view, bias.data(), got.data());
    expect_close(want, got, 1e-5, "fast f32 on kPanels, " + what);
    matmul_nt(ref_, x_rounded.data(), n, w.view, bias.data(), want_rounded.data());
    matmul_nt(bf16_, x.data(), n, p.view, bias.data(), got_bf16.data());
    matmul_nt(bf16_1_, x.data(), n, p.view, bias.data(), got_bf16_1.data());
    expect_close(want_rounded, got_bf16, 1e-5, "bf16 on kPanels vs reference on rounded x, " + what);
    ASSERT_EQ(got_bf16, got_bf16_1) << what << ": result depends on the thread count";
    if (n > 32) {
      matmul_nt(bf16_, x.data(), n, w.view, bias.data(), row_major_bf16.data());
      ASSERT_EQ(row_major_bf16, got_bf16) << what << ": kPanels changed the packed-path result";
    }
  }
}

// kPanelsTransposed (the backward's dx = dy·W on the forward's one copy of W): Wᵀ viewed over W's panels
// reads back exactly; the reference kernel gives the row-major Wᵀ result bit for bit, and so does the fast
// f32-precision call (it takes the reference); the fast bf16 kernel, which re-pairs each block as it packs
// it, gives what a kPanels copy of the row-major Wᵀ gives (the copy training kept before) bit for bit, plain
// and accumulating, whatever the thread count. The
// shapes: kMatmulShapes (tails in every direction, odd W rows and columns, several k blocks) and the AMX
// tile shapes (k a multiple of 32, n >= 32).
TEST_P(FastKernelsTest, MatmulTransposedPanelsMatchRowMajorTranspose) {
  std::vector<Mnk> shapes(std::begin(kMatmulShapes), std::end(kMatmulShapes));
  for (const Mnk& s : {Mnk{32, 64, 32}, {70, 130, 96}, {100, 200, 1056}, {64, 16, 2048}, {33, 65, 2080}}) shapes.push_back(s);
  for (auto [n, m, k] : shapes) {
    const KernelWeight w = make_kernel_weight(DType::kBF16, k, m, static_cast<uint32_t>(3 + n + m + k));  // W [k, m]
    const dc::testing::PackedCopy p(&pool_, w.view);
    const WeightView t = transposed_panels(p.view);  // Wᵀ [m, k]
    std::vector<uint16_t> wt_half(m * k);
    for (int64_t r = 0; r < k; ++r)
      for (int64_t c = 0; c < m; ++c) wt_half[c * k + r] = w.half[r * m + c];
    const WeightView wt{DType::kBF16, wt_half.data(), m, k};
    const std::string what = "n=" + std::to_string(n) + " m=" + std::to_string(m) + " k=" + std::to_string(k);
    std::vector<float> row(k), row_t(k);
    for (int64_t r = 0; r < m; ++r) {
      wt.row_to_f32(r, row.data());
      t.row_to_f32(r, row_t.data());
      ASSERT_EQ(row, row_t) << what << " row " << r;
    }
    const auto x = random_vec(n * k, static_cast<uint32_t>(29 + k)), y0 = random_vec(n * m, 6);
    std::vector<float> want(n * m), got(n * m);
    matmul_nt(ref_, x.data(), n, wt, nullptr, want.data());
    matmul_nt(ref_, x.data(), n, t, nullptr, got.data());
    ASSERT_EQ(want, got) << what << ": reference kernel on kPanelsTransposed";
    matmul_nt(fast_, x.data(), n, t, nullptr, got.data());
    ASSERT_EQ(want, got) << what << ": f32 precision on kPanelsTransposed";
    // What the old Wᵀ copy gave: the row-major Wᵀ packed as kPanels, which always takes the packed path.
    const dc::testing::PackedCopy wt_panels(&pool_, wt);
    std::vector<float> want_bf16(n * m), got_bf16(n * m), got_bf16_1(n * m), want_add = y0, got_add = y0;
    matmul_nt(bf16_, x.data(), n, wt_panels.view, nullptr, want_bf16.data());
    matmul_nt_add(bf16_, x.data(), n, wt_panels.view, want_add.data());
    matmul_nt(bf16_, x.data(), n, t, nullptr, got_bf16.data());
    matmul_nt(bf16_1_, x.data(), n, t, nullptr, got_bf16_1.data());
    matmul_nt_add(bf16_, x.data(), n, t, got_add.data());
    ASSERT_EQ(got_bf16, got_bf16_1) << what << ": result depends on the thread count";
    ASSERT_EQ(want_bf16, got_bf16) << what << ": kPanelsTransposed differs from the Wᵀ copy in kPanels";
    ASSERT_EQ(want_add, got_add) << what << ": kPanelsTransposed differs from the Wᵀ copy in kPanels (accumulating)";
  }
}

// f32 weights keep f32 activations at bf16 precision (f16 ones round them: MatmulBf16Activations...).
TEST_P(FastKernelsTest, MatmulBf16PrecisionLeavesF32WeightsExact) {
  const KernelWeight w = make_kernel_weight(DType::kF32, 70, 45, 2);
  const auto x = random_vec(9 * 45, 3);
  std::vector<float> want(9 * 70), got(9 * 70);
  matmul_nt(ref_, x.data(), 9, w.view, nullptr, want.data());
  matmul_nt(bf16_, x.data(), 9, w.view, nullptr, got.data());
  expect_close(want, got, 1e-5, "f32");
}

// On a CPU without AVX-512 (simulated) every fast kernel runs its reference kernel: identical results.
TEST_P(FastKernelsTest, PortableFallbackIsTheReference) {
  const KernelWeight w = make_kernel_weight(DType::kBF16, 33, 70, 4);
  const auto x = random_vec(10 * 70, 5), g = random_vec(10 * 70, 6), norm = random_vec(70, 7);
  const AttentionShape s{1, 10, 2, 1, 35};
  auto run = [&](const Context& ctx) {
    std::vector<float> y(10 * 33), n(10 * 70), sw(10 * 70), att(10 * 70), add = x;
    matmul_nt(ctx, x.data(), 10, w.view, nullptr, y.data());
    rms_norm(ctx, x.data(), norm.data(), 10, 70, 1e-6f, n.data());
    swiglu(ctx, g.data(), x.data(), 10 * 70, sw.data());
    add_inplace(ctx, add.data(), g.data(), 10 * 70);
    attention(ctx, s, x.data(), g.data(), g.data(), nullptr, att.data());  // q [10, 2·35], k = v [10, 35]
    return std::vector<std::vector<float>>{y, n, sw, add, att};
  };
  const auto want = run(ref_);
  cpu::force_portable_kernels_for_testing(true);
  const auto got = run(bf16_);
  cpu::force_portable_kernels_for_testing(false);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(want[i], got[i]) << "op " << i;
}

TEST_P(FastKernelsTest, RmsNorm) {
  for (int64_t d : {1, 15, 16, 37, 899}) {
    const int64_t n = d == 899 ? 70 : 23;  // 70 × 899: enough work for the pool
    const auto x = random_vec(n * d, 1, 3.0f), w = random_vec(d, 2);
    std::vector<float> want(n * d), got(n * d), in_place = x;
    rms_norm(ref_, x.data(), w.data(), n, d, 1e-6f, want.data());
    rms_norm(fast_, x.data(), w.data(), n, d, 1e-6f, got.data());
    rms_norm(fast_, in_place.data(), w.data(), n, d, 1e-6f, in_place.data());
    expect_close(want, got, 1e-6, "rms_norm d=" + std::to_string(d));
    EXPECT_EQ(got, in_place);
  }
}

TEST_P(FastKernelsTest, Rope) {
  for (int64_t D : {2, 8, 34, 64, 128}) {
    const int64_t n = D == 128 ? 101 : 41, heads = 3;  // 101 × 3 × 128: enough work for the pool
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 37 % 5000);
    std::vector<float> cos(n * D / 2), sin(n * D / 2);
    rope_tables(pos.data(), n, D, 1e6, cos.data(), sin.data());
    auto want = random_vec(n * heads * D, 3), got = want;
    rope_apply(ref_, want.data(), n, heads, D, cos.data(), sin.data());
    rope_apply(fast_, got.data(), n, heads, D, cos.data(), sin.data());
    expect_close(want, got, 1e-6, "rope D=" + std::to_string(D));
    rope_backward(ref_, want.data(), n, heads, D, cos.data(), sin.data());  // the inverse rotation
    rope_backward(fast_, got.data(), n, heads, D, cos.data(), sin.data());
    expect_close(want, got, 1e-6, "rope_backward D=" + std::to_string(D));
  }
}

TEST_P(FastKernelsTest, SwigluAndAdd) {
  for (int64_t count : {1, 15, 17, 1000, 70001}) {
    auto g = random_vec(count, 4, 4.0f);
    if (count > 4) g[0] = 100.0f, g[1] = -100.0f, g[2] = 88.0f, g[3] = -90.0f;  // exp over/underflow
    const auto u = random_vec(count, 5), y0 = random_vec(count, 6);
    std::vector<float> want(count), got(count), in_place = g;
    swiglu(ref_, g.data(), u.data(), count, want.data());
    swiglu(fast_, g.data(), u.data(), count, got.data());
    swiglu(fast_, in_place.data(), u.data(), count, in_place.data());
    expect_close(want, got, 1e-6, "swiglu count=" + std::to_string(count));
    EXPECT_EQ(got, in_place);
    auto y_want = y0, y_got = y0;
    add_inplace(ref_, y_want.data(), want.data(), count);
    add_inplace(fast_, y_got.data(), want.data(), count);
    EXPECT_EQ(y_want, y_got);
  }
}

// zero_fill: zeros exactly [offset, offset + count) of a buffer of NaNs, from every alignment (the
// streaming body and both plain ends), on the fast and the reference kernel, threaded and not.
TEST_P(FastKernelsTest, ZeroFillWritesExactlyTheRange) {
  for (const Context* ctx : {&ref_, &fast_})
    for (int64_t offset : {0, 1, 7, 16})
      for (int64_t count : {0, 1, 15, 16, 33, 70001}) {
        std::vector<float> buf(offset + count + 20, std::nanf(""));
        zero_fill(*ctx, buf.data() + offset, count);
        for (int64_t i = 0; i < static_cast<int64_t>(buf.size()); ++i) {
          const bool inside = i >= offset && i < offset + count;
          ASSERT_EQ(inside, buf[i] == 0.0f) << "offset " << offset << " count " << count << " index " << i;
        }
      }
}

// The backward element-wise passes: RMSNorm's (Σ in one pass, dx added into the residual gradient; the
// same bits on 1 and 3 threads), SwiGLU's (in place over dout, as the model calls it), against the
// reference kernels on tails of every width. RoPE's inverse rotation: in the Rope test.
TEST_P(FastKernelsTest, ElementwiseBackwardMatchesReference) {
  for (int64_t d : {1, 15, 16, 37, 899}) {
    const int64_t n = d == 899 ? 70 : 23;
    const auto x = random_vec(n * d, 11, 3.0f), w = random_vec(d, 12), dy = random_vec(n * d, 13),
               dx0 = random_vec(n * d, 14), dw0 = random_vec(d, 15);
    std::vector<std::vector<float>> results;  // dx, dw of ref, fast, fast on one thread
    for (const Context* ctx : {&ref_, &fast_, &fast1_}) {
      std::vector<float> dx = dx0, dw = dw0;
      rms_norm_backward(*ctx, x.data(), w.data(), dy.data(), n, d, 1e-6f, dx.data(), dw.data());
      results.push_back(dx), results.push_back(dw);
    }
    expect_close(results[0], results[2], 1e-5, "rms_norm_backward dx d=" + std::to_string(d));
    expect_close(results[1], results[3], 1e-5, "rms_norm_backward dw d=" + std::to_string(d));
    EXPECT_EQ(results[2], results[4]);
    EXPECT_EQ(results[3], results[5]);
    std::vector<float> dw_only = dw0;  // dx not wanted
    rms_norm_backward(fast_, x.data(), w.data(), dy.data(), n, d, 1e-6f, nullptr, dw_only.data());
    EXPECT_EQ(dw_only, results[3]);
  }
  for (int64_t count : {1, 15, 17, 1000, 70001}) {
    auto g = random_vec(count, 17, 4.0f);
    if (count > 4) g[0] = 100.0f, g[1] = -100.0f, g[2] = 88.0f, g[3] = -90.0f;  // exp over/underflow
    const auto u = random_vec(count, 18), dout = random_vec(count, 19);
    std::vector<float> want_g(count), want_u(count), got_g = dout, got_u(count);
    swiglu_backward(ref_, g.data(), u.data(), dout.data(), count, want_g.data(), want_u.data());
    swiglu_backward(fast_, g.data(), u.data(), got_g.data(), count, got_g.data(), got_u.data());  // dgate aliases dout
    expect_close(want_g, got_g, 1e-6, "swiglu_backward dgate count=" + std::to_string(count));
    expect_close(want_u, got_u, 1e-6, "swiglu_backward dup count=" + std::to_string(count));
  }
}

// The fused cross-entropy: loss, per-row CE and dlogits (in place over the logits) against the
// reference on vocabularies with tails, a dominant logit and very negative ones; the same bits on 1 and 3
// threads.
TEST_P(FastKernelsTest, CrossEntropyMatchesReference) {
  for (int64_t V : {1, 17, 1001, 40000}) {
    const int64_t n = 5;
    auto logits = random_vec(n * V, 21, 4.0f);
    if (V > 2) logits[1] = 60.0f, logits[V] = -200.0f;  // row 0 dominated; row 1 with an underflowing exp
    const std::vector<int32_t> targets = {0, static_cast<int32_t>(V - 1), static_cast<int32_t>(V / 2), 0,
                                          static_cast<int32_t>(V / 3)};
    const std::vector<float> weights = {1.0f, 0.5f, 2.0f, 0.0f, 1.5f};
    std::vector<std::vector<float>> grads, ces;
    std::vector<double> losses;
    for (const Context* ctx : {&ref_, &fast_, &fast1_}) {
      std::vector<float> g = logits, ce(n);
      losses.push_back(cross_entropy(*ctx, g.data(), targets.data(), weights.data(), n, V, g.data(), ce.data()));
      grads.push_back(g), ces.push_back(ce);
    }
    const std::string what = "cross_entropy V=" + std::to_string(V);
    EXPECT_NEAR(losses[1], losses[0], 1e-6 * (1.0 + std::abs(losses[0]))) << what;
    expect_close(ces[0], ces[1], 1e-6, what + " ce");
    expect_close(grads[0], grads[1], 1e-6, what + " dlogits");
    EXPECT_EQ(losses[1], losses[2]);
    EXPECT_EQ(grads[1], grads[2]);
  }
}

struct AttnCase {
  AttentionShape shape;
  int pattern;  // 0: no mask; 1: left padding (row b has 2b pads); 2: random holes, one row all invalid
};

TEST_P(FastKernelsTest, AttentionMatchesReference) {
  const AttnCase cases[] = {
      {{2, 7, 6, 2, 8}, 1},    {{1, 5, 8, 2, 4}, 0},     {{1, 130, 14, 2, 64}, 0}, {{3, 70, 4, 4, 128}, 1},
      {{2, 65, 6, 3, 80}, 2},  {{1, 1, 2, 1, 16}, 0},    {{2, 200, 7, 1, 34}, 2},  {{1, 64, 28, 4, 128}, 1},
  };
  for (const auto& c : cases) {
    const AttentionShape& s = c.shape;
    const int64_t B = s.n_batch, L = s.n_seq;
    const auto q = random_vec(B * L * s.n_head * s.head_dim, 1, 2.0f);
    const auto k = random_vec(B * L * s.n_head_kv * s.head_dim, 2, 2.0f);
    const auto v = random_vec(B * L * s.n_head_kv * s.head_dim, 3);
    std::vector<uint8_t> valid(B * L, 1);
    std::mt19937 gen(9);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i) {
        if (c.pattern == 1) valid[b * L + i] = i >= 2 * b;
        if (c.pattern == 2) valid[b * L + i] = b == 1 ? 0 : (gen() % 4 != 0);
      }
    const uint8_t* mask = c.pattern == 0 ? nullptr : valid.data();
    std::vector<float> want(q.size(), NAN), got(q.size(), NAN), got1(q.size(), NAN);
    attention(ref_, s, q.data(), k.data(), v.data(), mask, want.data());
    attention(fast_, s, q.data(), k.data(), v.data(), mask, got.data());
    attention(fast1_, s, q.data(), k.data(), v.data(), mask, got1.data());
    const std::string what = "attention B=" + std::to_string(B) + " L=" + std::to_string(L) + " H=" +
                             std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " D=" +
                             std::to_string(s.head_dim) + " pattern " + std::to_string(c.pattern);
    expect_close(want, got, 1e-5, what);
    ASSERT_EQ(got, got1) << what << ": result depends on the thread count";
    attention(bf16_, s, q.data(), k.data(), v.data(), mask, got1.data());  // attention stays f32
    ASSERT_EQ(got, got1) << what << ": MatmulPrecision::kBF16 changed attention";
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, FastKernelsTest, ::testing::Values(1, 3));

TEST(Bf16GemmPeak, MeasuresAPositiveRate) {
  ThreadPool pool(1);
  const double gflops = measure_bf16_gemm_peak_gflops(&pool);
  EXPECT_GT(gflops, 0.1);
  EXPECT_LT(gflops, 1e6);
}

}  // namespace
}  // namespace dc
