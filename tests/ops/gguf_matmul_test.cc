// matmul_nt over ggml block weights read in place (WeightQuant::kGguf, ops/cpu/gguf_blocks.h): for every
// block type, the reference kernel against the dequantize-then-multiply product, the decoded u8 form
// against the dequantization, and the AVX-512 VNNI kernel against the exact product within the bound its
// int8 activations imply, on odd shapes (1 row of x, rows of W not a multiple of the 32-row panel,
// columns over several 1024-column chunks), with 1 and 3 threads, through each of its two paths (kRows for
// a few rows of x, kPanels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "ops/cpu/gguf_blocks.h"
#include "ops/cpu/matmul_gguf.h"
#include "ops/cpu/quant.h"
#include "ops/matmul.h"

namespace dc {
namespace gguf_matmul_test {  // named: the test sources are built as one unit

using cpu::GgmlType;
using cpu::QuantKernel;

constexpr GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                               GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// Random blocks of `type` for rows × cols values: random bytes, with the f16 scale fields set so that the
// values stay within about ±1 (random f16 bytes would be anything, inf included).
std::vector<uint8_t> random_blocks(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  const cpu::GgmlBlockInfo info = cpu::ggml_block_info(type);
  std::vector<uint8_t> b(static_cast<size_t>(rows * cols / info.values * info.bytes));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(splitmix64(seed + i) >> 56);
  std::vector<std::pair<size_t, float>> fields;
  switch (type) {
    case GgmlType::kQ4_0: fields = {{0, 0.1f}}; break;
    case GgmlType::kQ4_1: fields = {{0, 0.01f}, {2, -0.08f}}; break;
    case GgmlType::kQ5_0: fields = {{0, 0.05f}}; break;
    case GgmlType::kQ5_1: fields = {{0, 0.005f}, {2, -0.08f}}; break;
    case GgmlType::kQ8_0: fields = {{0, 0.008f}}; break;
    case GgmlType::kQ2_K: fields = {{80, 0.01f}, {82, 0.01f}}; break;
    case GgmlType::kQ3_K: fields = {{108, 0.005f}}; break;
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: fields = {{0, 5e-4f}, {2, 5e-4f}}; break;
    case GgmlType::kQ6_K: fields = {{208, 2e-4f}}; break;
    case GgmlType::kNone: break;
  }
  for (size_t blk = 0; blk < b.size() / static_cast<size_t>(info.bytes); ++blk)
    for (const auto& [at, value] : fields) {
      // vary the scale per block (×0.5 .. ×1.5) so that blocks differ
      const float v = value * (0.5f + static_cast<float>(splitmix64(seed ^ (blk * 7919 + at)) >> 40) / 16777216.0f);
      const uint16_t h = f32_to_f16(v);
      std::memcpy(b.data() + blk * static_cast<size_t>(info.bytes) + at, &h, 2);
    }
  return b;
}

std::vector<float> random_x(int64_t n, int64_t k, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n * k));
  for (size_t i = 0; i < x.size(); ++i) {
    const double u = static_cast<double>(splitmix64(seed + i) >> 11) / 9007199254740992.0;
    x[i] = static_cast<float>(2.0 * u - 1.0) * (i % 37 == 0 ? 4.0f : 1.0f);  // a few larger values per group
  }
  return x;
}

WeightView view(GgmlType type, const std::vector<uint8_t>& blocks, int64_t rows, int64_t cols) {
  WeightView w;
  w.dtype = DType::kU8;
  w.quant = WeightQuant::kGguf;
  w.ggml_type = type;
  w.data = blocks.data();
  w.rows = rows;
  w.cols = cols;
  return w;
}

struct Shape {
  int64_t n, m, k;
};

int64_t block_of(GgmlType t) { return cpu::ggml_block_info(t).values; }

// The shapes for a type: k a multiple of its block; 1024-column chunks crossed; m not a multiple of 32.
std::vector<Shape> shapes_of(GgmlType t) {
  const int64_t b = block_of(t);
  return {{1, 1, b}, {1, 37, 4 * b}, {3, 32, b}, {7, 70, 5 * b}, {13, 33, b == 32 ? 1056 : 1280}, {33, 65, 2 * b}};
}

TEST(GgufMatmul, DecodedFormIsTheDequantization) {
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(cpu::ggml_block_info(t).name);
    const int64_t n = 2 * block_of(t);
    const auto blocks = random_blocks(t, 1, n, 11);
    std::vector<float> deq(static_cast<size_t>(n)), s(static_cast<size_t>(n / 16)), o(s.size());
    std::vector<uint8_t> u(static_cast<size_t>(n));
    cpu::ggml_dequantize(t, blocks.data(), deq.data(), n);
    cpu::ggml_decode_u8(t, blocks.data(), n, u.data(), s.data(), o.data());
    for (int64_t c = 0; c < n; ++c) {
      const float got = s[c / 16] * static_cast<float>(u[c]) + o[c / 16];
      // s·u and the offset are each within half an ulp of |s·u| (+ |o|) of exact: a few ulps of their size.
      const float tol = 4e-7f * (std::fabs(s[c / 16] * static_cast<float>(u[c])) + std::fabs(o[c / 16]));
      ASSERT_NEAR(got, deq[c], tol) << "value " << c;
    }
  }
}

// y = x · dequant(W)ᵀ in double over the f32 dequantized values: the oracle.
std::vector<double> exact_product(const std::vector<float>& x, int64_t n, const std::vector<float>& w, int64_t m, int64_t k) {
  std::vector<double> y(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(x[i * k + c]) * w[j * k + c];
      y[i * m + j] = acc;
    }
  return y;
}

TEST(GgufMatmul, ReferenceKernelIsTheDequantizedProduct) {
  ThreadPool pool(3);
  Workspace ws;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(cpu::ggml_block_info(t).name);
    for (const Shape& s : shapes_of(t)) {
      const auto blocks = random_blocks(t, s.m, s.k, 100 + s.m);
      const auto x = random_x(s.n, s.k, 7 + s.n);
      std::vector<float> wf(static_cast<size_t>(s.m * s.k));
      cpu::ggml_dequantize(t, blocks.data(), wf.data(), s.m * s.k);
      const auto want = exact_product(x, s.n, wf, s.m, s.k);
      std::vector<float> y(static_cast<size_t>(s.n * s.m));
      cpu::matmul_nt_quant(&pool, ws, x.data(), s.n, view(t, blocks, s.m, s.k), nullptr, y.data(), QuantKernel::kReference);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], static_cast<float>(want[i])) << "output " << i;
    }
  }
}

// The fast kernel's bound for output (i, j) (matmul_gguf.h): the activations' rounding, Σ_g sx_g/2 ·
// Σ_c∈g |w[j, c]|, plus f32 rounding of the per-group terms (s·sx·Σ c·xq and o·sx·Σ xq, each a few
// roundings, then summed over k/16 groups): (k/16 + 4)·2⁻²⁴ · Σ_g (|s_g|·sx_g·Σ c·|xq| + |o_g|·sx_g·Σ |xq|).
std::vector<double> fast_bound(GgmlType t, const std::vector<uint8_t>& blocks, const std::vector<float>& x, int64_t n,
                               int64_t m, int64_t k) {
  const int64_t groups = k / 16;
  std::vector<uint8_t> u(static_cast<size_t>(k));
  std::vector<float> s(static_cast<size_t>(groups)), o(s.size()), wf(static_cast<size_t>(k));
  std::vector<double> bound(static_cast<size_t>(n * m));
  const int64_t row_bytes = cpu::ggml_row_bytes(t, k);
  for (int64_t j = 0; j < m; ++j) {
    cpu::ggml_decode_u8(t, blocks.data() + j * row_bytes, k, u.data(), s.data(), o.data());
    cpu::ggml_dequantize(t, blocks.data() + j * row_bytes, wf.data(), k);
    for (int64_t i = 0; i < n; ++i) {
      double quant = 0, terms = 0;
      for (int64_t g = 0; g < groups; ++g) {
        float amax = 0;
        for (int64_t c = 16 * g; c < 16 * g + 16; ++c) amax = std::max(amax, std::fabs(x[i * k + c]));
        const double sx = amax / 127.0f;
        double wabs = 0, cu = 0, xq = 0;
        for (int64_t c = 16 * g; c < 16 * g + 16; ++c) {
          wabs += std::fabs(wf[c]);
          const double q = sx > 0 ? std::fabs(std::nearbyint(x[i * k + c] / sx)) : 0.0;
          cu += u[c] * q;
          xq += q;
        }
        quant += sx / 2 * wabs;
        terms += std::fabs(s[g]) * sx * cu + std::fabs(o[g]) * sx * xq;
      }
      bound[i * m + j] = quant * (1 + 1e-5) + static_cast<double>(groups + 4) * std::ldexp(1.0, -24) * terms + 1e-30;
    }
  }
  return bound;
}

// Runs the fast kernel (path `path`) on shape s of type t with a bias and checks every output against
// the exact product within fast_bound.
void check_fast_kernel(ThreadPool& pool, Workspace& ws, GgmlType t, const Shape& s, cpu::GgufPath path) {
  SCOPED_TRACE("n " + std::to_string(s.n) + " m " + std::to_string(s.m) + " k " + std::to_string(s.k));
  const auto blocks = random_blocks(t, s.m, s.k, 300 + s.k);
  const auto x = random_x(s.n, s.k, 5 + s.m);
  std::vector<float> wf(static_cast<size_t>(s.m * s.k));
  cpu::ggml_dequantize(t, blocks.data(), wf.data(), s.m * s.k);
  const auto want = exact_product(x, s.n, wf, s.m, s.k);
  const auto bound = fast_bound(t, blocks, x, s.n, s.m, s.k);
  std::vector<float> bias(static_cast<size_t>(s.m));
  for (int64_t j = 0; j < s.m; ++j) bias[j] = 0.25f * static_cast<float>(j % 5);
  std::vector<float> y(static_cast<size_t>(s.n * s.m), 1e30f);  // overwritten, never read
  const WeightView w = view(t, blocks, s.m, s.k);
  ASSERT_TRUE(cpu::int8_kernel_supports(w));
  if (path == cpu::GgufPath::kAuto) {
    cpu::matmul_nt_quant(&pool, ws, x.data(), s.n, w, bias.data(), y.data(), QuantKernel::kInt8Vnni);
  } else {
    cpu::matmul_nt_gguf_vnni(&pool, ws, x.data(), s.n, w, bias.data(), y.data(), path);
  }
  double worst = 0;
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t j = 0; j < s.m; ++j) {
      const size_t at = static_cast<size_t>(i * s.m + j);
      const double err = std::fabs(y[at] - (want[at] + bias[j]));
      // + the bias's own addition: one f32 rounding of the result
      ASSERT_LE(err, bound[at] + std::ldexp(std::fabs(want[at]) + bias[j], -23))
          << "y[" << i << ", " << j << "] = " << y[at] << ", exact " << want[at] + bias[j];
      worst = std::max(worst, err / bound[at]);
    }
  EXPECT_GT(worst, 0.0);  // it did round x (a kernel equal to the oracle would not test the bound)
}

TEST(GgufMatmul, FastKernelWithinItsActivationRounding) {
  if (!cpu::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    Workspace ws;
    for (GgmlType t : kTypes) {
      SCOPED_TRACE(cpu::ggml_block_info(t).name);
      for (const Shape& s : shapes_of(t)) check_fast_kernel(pool, ws, t, s, cpu::GgufPath::kAuto);
    }
  }
}

// Each path on its own, whatever n (kRows: the per-row decoding into registers, its 256-column super
// blocks and, for the 32-value types, a last partial one; kPanels: the 32-row panels): n from 1 to past a
// register tile, m odd, k at several multiples of 256 and (32-value types) of 32 only.
TEST(GgufMatmul, EachPathWithinItsActivationRounding) {
  if (!cpu::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  ThreadPool pool(2);
  Workspace ws;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(cpu::ggml_block_info(t).name);
    std::vector<Shape> shapes = {{1, 37, 256}, {2, 1, 768}, {3, 19, 1280}, {4, 33, 512}, {5, 37, 256}, {9, 7, 2304}};
    if (block_of(t) == 32) shapes.insert(shapes.end(), {{1, 5, 32}, {2, 37, 96}, {1, 3, 1056}, {4, 9, 480}, {6, 5, 224}});
    for (cpu::GgufPath path : {cpu::GgufPath::kRows, cpu::GgufPath::kPanels}) {
      SCOPED_TRACE(path == cpu::GgufPath::kRows ? "kRows" : "kPanels");
      for (const Shape& s : shapes) check_fast_kernel(pool, ws, t, s, path);
    }
  }
}

// The front-end (ops/matmul.h) dispatches kGguf weights: reference_kernels → the reference kernel, else the
// fast one; and such a weight is never packed (it is read in place).
TEST(GgufMatmul, FrontEndDispatchAndNoPacking) {
  ThreadPool pool(2);
  const GgmlType t = GgmlType::kQ4_K;
  const auto blocks = random_blocks(t, 40, 512, 1);
  const auto x = random_x(3, 512, 2);
  const WeightView w = view(t, blocks, 40, 512);
  Context ctx{Device::kCpu, &pool};
  ctx.reference_kernels = true;
  std::vector<float> y_ref(3 * 40), y_ref_direct(3 * 40), y_fast(3 * 40);
  matmul_nt(ctx, x.data(), 3, w, nullptr, y_ref.data());
  Workspace ws;
  cpu::matmul_nt_quant(&pool, ws, x.data(), 3, w, nullptr, y_ref_direct.data(), QuantKernel::kReference);
  EXPECT_EQ(y_ref, y_ref_direct);
  ctx.reference_kernels = false;
  EXPECT_FALSE(worth_packing(ctx, w));
  EXPECT_EQ(panel_sizes(w).panels, 0);
  matmul_nt(ctx, x.data(), 3, w, nullptr, y_fast.data());
  if (cpu::cpu_has_avx512_vnni()) EXPECT_NE(y_fast, y_ref);  // the int8 kernel ran
  for (size_t i = 0; i < y_fast.size(); ++i) EXPECT_NEAR(y_fast[i], y_ref[i], 0.05f * (1 + std::fabs(y_ref[i])));
}

// row_to_f32 of a kGguf view (the embedding lookup of a quantized token table) is the row's dequantization.
TEST(GgufMatmul, RowToF32Dequantizes) {
  for (GgmlType t : kTypes) {
    const int64_t k = 2 * block_of(t);
    const auto blocks = random_blocks(t, 3, k, 9);
    std::vector<float> want(static_cast<size_t>(k)), got(static_cast<size_t>(k));
    cpu::ggml_dequantize(t, blocks.data() + 2 * cpu::ggml_row_bytes(t, k), want.data(), k);
    view(t, blocks, 3, k).row_to_f32(2, got.data());
    EXPECT_EQ(got, want) << cpu::ggml_block_info(t).name;
  }
}

}  // namespace gguf_matmul_test
}  // namespace dc
