// Each Vulkan kernel against the CPU reference kernel (Context::reference_kernels) on shapes with odd
// sizes and tails, on device 0 (lavapipe in CI). Tolerances, relative to the largest reference value:
// 1e-5 for the f32-accumulated products and reductions (another summation order), 1e-6 for the
// element-wise ops, 2e-5 for attention (exp of the device), 1e-4 absolute for RoPE's device cos / sin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernel_test_util.h"
#include "ops/attention.h"
#include "ops/attention_window.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/vulkan/kernels.h"
#include "ops/vulkan/runtime_impl.h"
#include "sampler/filters.h"
#include "sampler/rng.h"
#include "vulkan_test_util.h"

namespace dc {
namespace {

using testing::cpu_reference;
using testing::expect_close;
using testing::make_weight;
using testing::TestWeight;
using testing::ok_or_throw;
using testing::random_floats;
using testing::vulkan_runtime;

TEST(VulkanKernels, MatmulEveryWeightKindAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t rows = 67, cols = 42;  // tails in both tile dimensions; q4 groups of 14 columns
  for (const std::string kind : {"f32", "f16", "bf16", "q8", "q4"}) {
    const TestWeight w = make_weight(kind, rows, cols, 14, 7);
    const vk::DeviceMatrix dw = ok_or_throw(vk::upload_matrix(rt, w.host, kind));
    const std::vector<float> bias = random_floats(3, rows);
    const vk::Buffer dbias = ok_or_throw(rt.make_buffer(bias, "bias"));
    for (int64_t n : {1, 3, 8, 9, 70}) {  // n <= 8: the subgroup kernel; above: the tiled one, with a tail
      for (bool with_bias : {false, true}) {
        const std::vector<float> x = random_floats(100 + n, static_cast<size_t>(n * cols));
        std::vector<float> want(static_cast<size_t>(n * rows));
        matmul_nt(cpu_reference(), x.data(), n, w.view, with_bias ? bias.data() : nullptr, want.data());
        const vk::Buffer dx = ok_or_throw(rt.make_buffer(x, "x"));
        vk::Buffer dy = ok_or_throw(rt.alloc(n * rows * 4, "y"));
        auto seq = ok_or_throw(rt.new_sequence());
        ok_or_throw(vk::matmul_nt(seq, dx, n, dw, with_bias ? &dbias : nullptr, dy));
        ok_or_throw(seq.run());
        expect_close(want, ok_or_throw(rt.read<float>(dy, n * rows)), 1e-5,
                     kind + " n=" + std::to_string(n) + (with_bias ? " bias" : ""));
      }
    }
  }
}

// The matrix units (DeviceInfo::matrix_units; NVIDIA GPUs) against the CPU on x rounded to f16, which is
// what they multiply: products of f16 values are exact in f32, so only the order of the f32 sums differs.
// Two W tiles with a tail (195 rows of 128-row tiles), 9 / 33 / 70 of 64 x rows, 1 and 5 k-slices of 64,
// and with a split scratch the 5 slices in several workgroups summed by split_reduce (a second dispatch);
// 96 columns are not a multiple of 64 and take the f32 kernel. On a device without them (lavapipe),
// matrix_units = true must run the f32 kernel: the same check against the unrounded x.
TEST(VulkanKernels, MatmulOnTheMatrixUnitsAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const bool units = rt.info().matrix_units;
  const int64_t rows = 195;
  vk::Buffer scratch = ok_or_throw(rt.alloc(int64_t{1} << 20, "split scratch"));
  for (const int64_t cols : {64, 96, 320}) {
    for (const std::string kind : {"f16", "bf16", "f32"}) {
      const TestWeight w = make_weight(kind, rows, cols, 0, 21);
      const vk::DeviceMatrix dw = ok_or_throw(vk::upload_matrix(rt, w.host, kind));
      const std::vector<float> bias = random_floats(22, rows);
      const vk::Buffer dbias = ok_or_throw(rt.make_buffer(bias, "bias"));
      EXPECT_EQ(vk::uses_matrix_units(rt.info(), 33, dw), units && kind != "f32" && cols != 96) << kind;
      for (const int64_t n : {9, 33, 70}) {
        std::vector<float> x = random_floats(200 + n, static_cast<size_t>(n * cols));
        const vk::Buffer dx = ok_or_throw(rt.make_buffer(x, "x"));
        if (vk::uses_matrix_units(rt.info(), n, dw))
          for (float& v : x) v = f16_to_f32(f32_to_f16(v));
        std::vector<float> want(static_cast<size_t>(n * rows));
        matmul_nt(cpu_reference(), x.data(), n, w.view, bias.data(), want.data());
        for (vk::Buffer* split : {static_cast<vk::Buffer*>(nullptr), &scratch}) {
          vk::Buffer dy = ok_or_throw(rt.alloc(n * rows * 4, "y"));
          auto seq = ok_or_throw(rt.new_sequence());
          ok_or_throw(vk::matmul_nt(seq, dx, n, dw, &dbias, dy, /*matrix_units=*/true, split));
          EXPECT_EQ(seq.dispatches(), split != nullptr && cols == 320 && vk::uses_matrix_units(rt.info(), n, dw) ? 2 : 1);
          ok_or_throw(seq.run());
          expect_close(want, ok_or_throw(rt.read<float>(dy, n * rows)), 1e-5,
                       kind + " cols=" + std::to_string(cols) + " n=" + std::to_string(n) + (split ? " split" : ""));
        }
      }
    }
  }
  std::printf("  matrix units: %s\n", units ? "present, checked" : "absent: the f32 kernel ran");
}

// The GEMM epilogues (kernels.h Epilogue) against the CPU's matmul_nt then add_inplace / swiglu: the residual
// add into y, and SwiGLU with the gate in its own buffer and in place (y = the gate). Tails in both tile
// dimensions and in k (67 × 42, q4 groups of 14), n through the subgroup kernel (3), the tiled one with a tail
// (70) and, where a device has them, the matrix units with and without a split (320 columns: 5 k-slices).
TEST(VulkanKernels, MatmulEpiloguesAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  vk::Buffer scratch = ok_or_throw(rt.alloc(int64_t{1} << 20, "split scratch"));
  struct Case { std::string kind; int64_t rows, cols; bool units; vk::Buffer* split; };
  for (const Case& c : {Case{"f32", 67, 42, false, nullptr}, Case{"bf16", 67, 42, false, nullptr}, Case{"q8", 67, 42, false, nullptr},
                        Case{"q4", 67, 42, false, nullptr}, Case{"f16", 195, 320, true, nullptr}, Case{"bf16", 195, 320, true, &scratch}}) {
    const TestWeight w = make_weight(c.kind, c.rows, c.cols, 14, 31);
    const vk::DeviceMatrix dw = ok_or_throw(vk::upload_matrix(rt, w.host, c.kind));
    for (const int64_t n : {3, 70}) {
      const size_t ny = static_cast<size_t>(n * c.rows);
      std::vector<float> x = random_floats(300 + n, static_cast<size_t>(n * c.cols));
      const vk::Buffer dx = ok_or_throw(rt.make_buffer(x, "x"));
      if (c.units && vk::uses_matrix_units(rt.info(), n, dw))
        for (float& v : x) v = f16_to_f32(f32_to_f16(v));  // what the matrix units multiply
      const std::vector<float> h = random_floats(400 + n, ny), gate = random_floats(500 + n, ny, -6, 6);
      std::vector<float> product(ny), want_add = h, want_swiglu(ny);
      matmul_nt(cpu_reference(), x.data(), n, w.view, nullptr, product.data());
      add_inplace(cpu_reference(), want_add.data(), product.data(), n * c.rows);
      swiglu(cpu_reference(), gate.data(), product.data(), n * c.rows, want_swiglu.data());
      vk::Buffer dh = ok_or_throw(rt.make_buffer(h, "h")), dgate = ok_or_throw(rt.make_buffer(gate, "gate"));
      vk::Buffer in_place = ok_or_throw(rt.make_buffer(gate, "gate, in place")), dout = ok_or_throw(rt.alloc(n * c.rows * 4, "out"));
      auto seq = ok_or_throw(rt.new_sequence());
      ok_or_throw(vk::matmul_nt(seq, dx, n, dw, nullptr, dh, c.units, c.split, {vk::Epilogue::kAdd, &dh}));
      ok_or_throw(vk::matmul_nt(seq, dx, n, dw, nullptr, dout, c.units, c.split, {vk::Epilogue::kSwiglu, &dgate}));
      ok_or_throw(vk::matmul_nt(seq, dx, n, dw, nullptr, in_place, c.units, c.split, {vk::Epilogue::kSwiglu, &in_place}));
      ok_or_throw(seq.run());
      const std::string what = c.kind + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " n=" + std::to_string(n) +
                               (c.split ? " split" : "");
      expect_close(want_add, ok_or_throw(rt.read<float>(dh, n * c.rows)), 1e-5, what + " residual add");
      expect_close(want_swiglu, ok_or_throw(rt.read<float>(dout, n * c.rows)), 1e-5, what + " swiglu");
      expect_close(want_swiglu, ok_or_throw(rt.read<float>(in_place, n * c.rows)), 1e-5, what + " swiglu in place");
    }
  }
  vk::Buffer y = ok_or_throw(rt.alloc(3 * 67 * 4, "y")), x = ok_or_throw(rt.alloc(3 * 42 * 4, "x"));
  const TestWeight w = make_weight("f32", 67, 42, 0, 1);
  const vk::DeviceMatrix dw = ok_or_throw(vk::upload_matrix(rt, w.host, "w"));
  auto seq = ok_or_throw(rt.new_sequence());
  const Status s = vk::matmul_nt(seq, x, 3, dw, nullptr, y, false, nullptr, {vk::Epilogue::kSwiglu, nullptr});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("aux operand is missing"), std::string::npos) << s.message();
}

TEST(VulkanKernels, MatmulChecksShapes) {
  vk::Runtime& rt = vulkan_runtime();
  const TestWeight w = make_weight("f32", 5, 6, 0, 1);
  const vk::DeviceMatrix dw = ok_or_throw(vk::upload_matrix(rt, w.host, "w"));
  const vk::Buffer x = ok_or_throw(rt.alloc(2 * 6 * 4, "x"));
  vk::Buffer small = ok_or_throw(rt.alloc(2 * 5 * 4 - 4, "y"));
  auto seq = ok_or_throw(rt.new_sequence());
  const Status s = vk::matmul_nt(seq, x, 2, dw, nullptr, small);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("y [n, rows]"), std::string::npos) << s.message();
  EXPECT_EQ(vk::matmul_nt(seq, x, 3, dw, nullptr, small).code(), StatusCode::kInvalidArgument);
  vk::HostMatrix bad = w.host;
  bad.quant = WeightQuant::kQ4, bad.dtype = DType::kU8, bad.group_size = 4;  // 4 does not divide 6
  EXPECT_EQ(vk::upload_matrix(rt, bad, "bad").status().code(), StatusCode::kInvalidArgument);
}

// The embedding lookup over every weight kind, and the gather of f32 rows, equal to the CPU's (exact:
// a widening, no arithmetic beyond the q8 / q4 scale).
TEST(VulkanKernels, GatherRowsEveryWeightKindAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t rows = 37, cols = 42, n = 9;
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 35, 20, 9};
  const vk::Buffer dids = ok_or_throw(rt.make_buffer(ids, "ids"));
  for (const std::string kind : {"f32", "f16", "bf16", "q8", "q4"}) {
    const TestWeight w = make_weight(kind, rows, cols, 14, 11);
    const vk::DeviceMatrix dw = ok_or_throw(vk::upload_matrix(rt, w.host, kind));
    std::vector<float> want(static_cast<size_t>(n * cols));
    embedding(cpu_reference(), w.view, ids.data(), n, want.data());
    vk::Buffer out = ok_or_throw(rt.alloc(n * cols * 4, "out"));
    auto seq = ok_or_throw(rt.new_sequence());
    ok_or_throw(vk::gather_rows(seq, dw, dids, n, out));
    ok_or_throw(seq.run());
    expect_close(want, ok_or_throw(rt.read<float>(out, n * cols)), 1e-6, "embedding " + kind);
  }
  const std::vector<float> x = random_floats(5, static_cast<size_t>(rows * cols));
  std::vector<float> want(static_cast<size_t>(n * cols));
  gather_rows(cpu_reference(), x.data(), cols, ids.data(), n, want.data());
  const vk::Buffer dx = ok_or_throw(rt.make_buffer(x, "x"));
  vk::Buffer out = ok_or_throw(rt.alloc(n * cols * 4, "out"));
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::gather_rows(seq, dx, cols, dids, n, out));
  ok_or_throw(seq.run());
  EXPECT_EQ(want, ok_or_throw(rt.read<float>(out, n * cols)));
  EXPECT_EQ(vk::gather_rows(seq, dx, cols, dids, n + 1, out).code(), StatusCode::kInvalidArgument);  // ids too short
}

TEST(VulkanKernels, RmsNormAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  for (int64_t d : {67, 300}) {
    const int64_t n = 5;
    const std::vector<float> x = random_floats(d, static_cast<size_t>(n * d), -3, 3), w = random_floats(d + 1, static_cast<size_t>(d));
    std::vector<float> want(x.size());
    rms_norm(cpu_reference(), x.data(), w.data(), n, d, 1e-6f, want.data());
    vk::Buffer dx = ok_or_throw(rt.make_buffer(x, "x"));
    const vk::Buffer dw = ok_or_throw(rt.make_buffer(w, "w"));
    auto seq = ok_or_throw(rt.new_sequence());
    ok_or_throw(vk::rms_norm(seq, dx, dw, n, d, 1e-6f, dx));  // in place
    ok_or_throw(seq.run());
    expect_close(want, ok_or_throw(rt.read<float>(dx, n * d)), 1e-5, "rms_norm d=" + std::to_string(d));
  }
}

TEST(VulkanKernels, RopeTablesAndApplyAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 7, n_heads = 3, head_dim = 18, half = head_dim / 2;
  const std::vector<int32_t> positions = {0, 1, 5, 33, 511, 2047, 4000};
  std::vector<float> cos_want(n * half), sin_want(n * half);
  rope_tables(positions.data(), n, head_dim, 1e6, cos_want.data(), sin_want.data());
  const vk::Buffer pos = ok_or_throw(rt.make_buffer(positions, "positions"));
  const vk::Buffer inv_freq = ok_or_throw(vk::rope_inv_freq(rt, head_dim, 1e6));
  vk::Buffer cos = ok_or_throw(rt.alloc(n * half * 4, "cos")), sin = ok_or_throw(rt.alloc(n * half * 4, "sin"));
  auto tables = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::rope_tables(tables, pos, n, head_dim, inv_freq, cos, sin));
  ok_or_throw(tables.run());
  expect_close(cos_want, ok_or_throw(rt.read<float>(cos, n * half)), 1e-4, "rope cos");
  expect_close(sin_want, ok_or_throw(rt.read<float>(sin, n * half)), 1e-4, "rope sin");

  // rope_apply on the CPU's own tables: the same arithmetic.
  ok_or_throw(rt.upload(cos, cos_want.data(), n * half * 4));
  ok_or_throw(rt.upload(sin, sin_want.data(), n * half * 4));
  std::vector<float> x = random_floats(5, static_cast<size_t>(n * n_heads * head_dim));
  vk::Buffer dx = ok_or_throw(rt.make_buffer(x, "x"));
  rope_apply(cpu_reference(), x.data(), n, n_heads, head_dim, cos_want.data(), sin_want.data());
  auto apply = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::rope_apply(apply, dx, n, n_heads, head_dim, cos, sin));
  ok_or_throw(apply.run());
  expect_close(x, ok_or_throw(rt.read<float>(dx, n * n_heads * head_dim)), 1e-6, "rope_apply");
  EXPECT_EQ(vk::rope_apply(apply, dx, n, n_heads, 17, cos, sin).code(), StatusCode::kInvalidArgument);
}

TEST(VulkanKernels, SwigluAndAddAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t count = 1001;
  const std::vector<float> gate = random_floats(1, count, -6, 6), up = random_floats(2, count);
  std::vector<float> want(count), sum = gate;
  swiglu(cpu_reference(), gate.data(), up.data(), count, want.data());
  add_inplace(cpu_reference(), sum.data(), up.data(), count);
  vk::Buffer g = ok_or_throw(rt.make_buffer(gate, "gate")), u = ok_or_throw(rt.make_buffer(up, "up"));
  vk::Buffer out = ok_or_throw(rt.alloc(count * 4, "out"));
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::swiglu(seq, g, u, count, out));
  ok_or_throw(vk::add_inplace(seq, g, u, count));
  ok_or_throw(seq.run());
  expect_close(want, ok_or_throw(rt.read<float>(out, count)), 1e-6, "swiglu");
  expect_close(sum, ok_or_throw(rt.read<float>(g, count)), 1e-6, "add_inplace");
}

// Full and windowed attention on `rt`, MHA and GQA, head dims 16..128, 37 keys (odd: a partial tile), a
// left-padded row (its first 5 keys invalid). lowered: each case with the device's shared memory
// lowered to what the 8 × 8 tile needs at its head_dim (a test hook on rt's DeviceInfo), so that the tiled
// path runs: its pipeline must exist afterwards.
void attention_against_the_cpu(vk::Runtime& rt, bool lowered) {
  struct Case { int64_t n_head, n_head_kv, head_dim; };
  vk::Buffer scratch = ok_or_throw(rt.alloc(int64_t{1} << 20, "split scratch"));
  for (const Case c : {Case{3, 3, 32}, Case{4, 2, 16}, Case{4, 1, 64}, Case{2, 2, 128}}) {
    if (lowered) rt.impl().info.max_shared_bytes = vk::attention_shared_bytes(c.head_dim, {8, 8});
    AttentionShape shape;
    shape.n_batch = 2, shape.n_seq = 37, shape.n_head = c.n_head, shape.n_head_kv = c.n_head_kv, shape.head_dim = c.head_dim;
    const int64_t L = shape.n_seq, B = shape.n_batch, D = c.head_dim;
    const std::vector<float> q = random_floats(D, static_cast<size_t>(B * L * c.n_head * D), -2, 2);
    const std::vector<float> k = random_floats(D + 1, static_cast<size_t>(B * L * c.n_head_kv * D), -2, 2);
    const std::vector<float> v = random_floats(D + 2, static_cast<size_t>(B * L * c.n_head_kv * D));
    std::vector<uint8_t> valid(static_cast<size_t>(B * L + 3) / 4 * 4, 1);
    for (int j = 0; j < 17; ++j) valid[L + j] = 0;  // a split of the window test without any valid key
    const vk::Buffer dq = ok_or_throw(rt.make_buffer(q, "q")), dk = ok_or_throw(rt.make_buffer(k, "k"));
    const vk::Buffer dv = ok_or_throw(rt.make_buffer(v, "v")), dvalid = ok_or_throw(rt.make_buffer(valid, "valid"));
    const std::string what = "H=" + std::to_string(c.n_head) + " Hkv=" + std::to_string(c.n_head_kv) + " D=" + std::to_string(D);
    {  // the full forward
      std::vector<float> want(q.size());
      attention(cpu_reference(), shape, q.data(), k.data(), v.data(), valid.data(), want.data());
      vk::Buffer out = ok_or_throw(rt.alloc(static_cast<int64_t>(q.size()) * 4, "out"));
      auto seq = ok_or_throw(rt.new_sequence());
      ok_or_throw(vk::attention(seq, {B, L, c.n_head, c.n_head_kv, D}, 0, L, dq, dk, dv, &dvalid, out));
      ok_or_throw(seq.run());
      const std::vector<float> got = ok_or_throw(rt.read<float>(out, static_cast<int64_t>(q.size())));
      expect_close(want, got, 2e-5, "attention " + what);
      for (int64_t d = 0; d < c.n_head * D; ++d) ASSERT_EQ(got[static_cast<size_t>(L * c.n_head * D + d)], 0.0f) << "padded query";
    }
    // A window of 9 queries at position 11 against every key (the cached forward); with a scratch, the keys
    // split over workgroups (one key tile each) and merged by attention_combine.
    for (vk::Buffer* split : {static_cast<vk::Buffer*>(nullptr), &scratch}) {
      const int64_t begin = 11, W = 9;
      const std::vector<float> qw(q.begin(), q.begin() + B * W * c.n_head * D);  // any W queries
      std::vector<float> want(qw.size());
      attention_window(cpu_reference(), shape, begin, W, qw.data(), k.data(), v.data(), valid.data(), want.data());
      const vk::Buffer dqw = ok_or_throw(rt.make_buffer(qw, "q window"));
      vk::Buffer out = ok_or_throw(rt.alloc(static_cast<int64_t>(qw.size()) * 4, "out"));
      auto seq = ok_or_throw(rt.new_sequence());
      ok_or_throw(vk::attention(seq, {B, L, c.n_head, c.n_head_kv, D}, begin, W, dqw, dk, dv, &dvalid, out, split));
      EXPECT_EQ(seq.dispatches(), split ? 2 : 1) << what;
      ok_or_throw(seq.run());
      expect_close(want, ok_or_throw(rt.read<float>(out, static_cast<int64_t>(qw.size()))), 2e-5,
                   "attention window " + what + (split ? " split" : ""));
    }
    if (lowered) {
      const std::vector<int32_t> spec{static_cast<int32_t>(D), 8, 8, 64};
      EXPECT_EQ(rt.impl().pipelines.count(vk::Runtime::Impl::PipelineKeyView{"attention", spec}), 1u)
          << "the 8 × 8 tile did not run: " << what;
    }
  }
}

TEST(VulkanKernels, AttentionAgainstTheCpu) { attention_against_the_cpu(vulkan_runtime(), false); }

// The tiled path within the 16 KiB of shared memory every device guarantees: head_dim 128 needs 12.6 KB in
// 8 × 8 tiles (25.7 KB in 16 × 16), and every head dim runs them when the limit is lowered (a runtime of its
// own: the hook changes its DeviceInfo).
TEST(VulkanKernels, AttentionInEightByEightTilesAgainstTheCpu) {
  EXPECT_LE(vk::attention_shared_bytes(128, vk::attention_tile(128, 16384)), 16384);
  EXPECT_EQ(vk::attention_tile(128, 16384).rows, 8);
  EXPECT_EQ(vk::attention_tile(64, 16384).rows, 16);
  auto rt = ok_or_throw(vk::Runtime::open(0));
  attention_against_the_cpu(*rt, true);
}

TEST(VulkanKernels, AttentionChecksShapes) {
  vk::Runtime& rt = vulkan_runtime();
  vk::Buffer b = ok_or_throw(rt.alloc(1 << 16, "b"));
  auto seq = ok_or_throw(rt.new_sequence());
  EXPECT_EQ(vk::attention(seq, {1, 8, 2, 2, 130}, 0, 8, b, b, b, nullptr, b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(vk::attention(seq, {1, 8, 3, 2, 16}, 0, 8, b, b, b, nullptr, b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(vk::attention(seq, {1, 8, 2, 2, 16}, 4, 5, b, b, b, nullptr, b).code(), StatusCode::kInvalidArgument);
  vk::Buffer tiny = ok_or_throw(rt.alloc(4, "tiny"));
  const Status s = vk::attention(seq, {1, 8, 2, 2, 16}, 0, 8, b, tiny, b, nullptr, b);
  EXPECT_NE(s.message().find("k [B, L, n_head_kv, head_dim]"), std::string::npos) << s.message();
}

// The shared-memory check of the attention kernel: head_dim 128 fits the 16 KiB every device guarantees (in
// 8 × 8 tiles) and not 8 KiB; the errors name head_dim and the limit.
TEST(VulkanKernels, AttentionHeadDimIsCheckedAgainstSharedMemory) {
  EXPECT_GE(vulkan_runtime().info().max_shared_bytes, 16384);
  EXPECT_TRUE(vk::check_attention_head_dim(64, 16384).ok());
  EXPECT_TRUE(vk::check_attention_head_dim(128, 16384).ok());
  const Status s = vk::check_attention_head_dim(128, 8192);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head_dim 128"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("8192"), std::string::npos) << s.message();
  EXPECT_NE(vk::check_attention_head_dim(8, 1 << 20).message().find("head_dim 8"), std::string::npos);
}

// The window's K/V into the cache against the CPU op: only the window's positions change.
TEST(VulkanKernels, KvStoreAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t B = 3, L = 13, C = 7, begin = 4, W = 6;
  std::vector<float> cache = random_floats(1, static_cast<size_t>(B * L * C));
  const std::vector<float> src = random_floats(2, static_cast<size_t>(B * W * C));
  vk::Buffer dcache = ok_or_throw(rt.make_buffer(cache, "cache")), dsrc = ok_or_throw(rt.make_buffer(src, "src"));
  kv_store(cpu_reference(), src.data(), B, L, begin, W, C, cache.data());
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::kv_store(seq, dsrc, B, L, begin, W, C, dcache));
  ok_or_throw(seq.run());
  EXPECT_EQ(ok_or_throw(rt.read<float>(dcache, B * L * C)), cache);
  EXPECT_EQ(cache[static_cast<size_t>((L + begin) * C)], src[static_cast<size_t>(W * C)]);  // row 1's first window position
  EXPECT_EQ(vk::kv_store(seq, dsrc, B, L, 9, W, C, dcache).code(), StatusCode::kInvalidArgument);  // beyond L
}

// `x` after `pad` copies of `fill`: an operand that starts `pad` elements into its buffer.
template <typename T>
std::vector<T> after_prefix(std::vector<T> x, int64_t pad, T fill) {
  x.insert(x.begin(), static_cast<size_t>(pad), fill);
  return x;
}

// The per-part offsets of rope_kv and attention (a forward of parts on a device: kernels.h RopeKvOffsets,
// AttentionOffsets): operands that start inside larger buffers give bit for bit what they give in buffers of
// their own, over a window of 7 of 19 positions (not multiples of the tile), split or not, and nothing before
// their rows changes; an offset that runs past its buffer is refused naming the operand.
TEST(VulkanKernels, OperandsAtOffsetsEqualOperandsOfTheirOwn) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t B = 2, L = 19, H = 4, Hkv = 2, D = 16, begin = 5, W = 7, n = B * W, C = Hkv * D;
  const std::vector<float> q = random_floats(1, static_cast<size_t>(n * H * D), -2, 2), k = random_floats(2, static_cast<size_t>(n * C), -2, 2);
  const std::vector<float> v = random_floats(3, static_cast<size_t>(n * C)), cos_t = random_floats(4, static_cast<size_t>(n * D / 2));
  const std::vector<float> sin_t = random_floats(5, static_cast<size_t>(n * D / 2)), cache = random_floats(6, static_cast<size_t>(B * L * C));
  std::vector<uint8_t> valid(static_cast<size_t>(B * L), 1);
  for (int j = 0; j < 4; ++j) valid[static_cast<size_t>(L + j)] = 0;  // row 1 left-padded
  vk::Buffer scratch = ok_or_throw(rt.alloc(int64_t{1} << 20, "split scratch"));
  const vk::RopeKvOffsets rope_at{37, 5, 11, 3, 9};
  const vk::AttentionOffsets attn_at{rope_at.q, 0, 0, 6, 29};  // q where rope_kv left it; k / v the caches
  const vk::KvWindow window{B, L, begin, W};
  // rope_kv with the store, then the window's attention over the caches, with the operands at `at` (zero: their own).
  const auto run = [&](const vk::RopeKvOffsets& r, const vk::AttentionOffsets& a, vk::Buffer* split) {
    vk::Buffer dq = ok_or_throw(rt.make_buffer(after_prefix(q, r.q, -7.0f), "q")), dk = ok_or_throw(rt.make_buffer(after_prefix(k, r.k, -7.0f), "k"));
    const vk::Buffer dv = ok_or_throw(rt.make_buffer(after_prefix(v, r.v, -7.0f), "v"));
    const vk::Buffer dcos = ok_or_throw(rt.make_buffer(after_prefix(cos_t, r.cos, -7.0f), "cos"));
    const vk::Buffer dsin = ok_or_throw(rt.make_buffer(after_prefix(sin_t, r.sin, -7.0f), "sin"));
    std::vector<uint8_t> mask = after_prefix(valid, a.valid, uint8_t{0});
    mask.resize((mask.size() + 3) / 4 * 4, 0);
    const vk::Buffer dvalid = ok_or_throw(rt.make_buffer(mask, "valid"));
    vk::Buffer dck = ok_or_throw(rt.make_buffer(cache, "cache k")), dcv = ok_or_throw(rt.make_buffer(cache, "cache v"));
    vk::Buffer out = ok_or_throw(rt.make_buffer(std::vector<float>(static_cast<size_t>(a.out + n * H * D), -7.0f), "out"));
    auto seq = ok_or_throw(rt.new_sequence());
    ok_or_throw(vk::rope_kv(seq, dq, dk, n, H, Hkv, D, dcos, dsin, &window, &dv, &dck, &dcv, r));
    ok_or_throw(vk::attention(seq, {B, L, H, Hkv, D}, begin, W, dq, dck, dcv, &dvalid, out, split, a));
    ok_or_throw(seq.run());
    std::vector<std::vector<float>> got{ok_or_throw(rt.read<float>(dq, r.q + n * H * D)), ok_or_throw(rt.read<float>(dk, r.k + n * C)),
                                        ok_or_throw(rt.read<float>(dck, B * L * C)), ok_or_throw(rt.read<float>(dcv, B * L * C)),
                                        ok_or_throw(rt.read<float>(out, a.out + n * H * D))};
    const int64_t pads[] = {r.q, r.k, 0, 0, a.out};  // each prefix untouched, then dropped
    for (size_t i = 0; i < got.size(); ++i) {
      for (int64_t e = 0; e < pads[i]; ++e) EXPECT_EQ(got[i][static_cast<size_t>(e)], -7.0f) << "operand " << i << " before its rows, " << e;
      got[i].erase(got[i].begin(), got[i].begin() + pads[i]);
    }
    return got;
  };
  for (vk::Buffer* split : {static_cast<vk::Buffer*>(nullptr), &scratch}) {
    const auto own = run({}, {}, split), at = run(rope_at, attn_at, split);
    for (size_t i = 0; i < own.size(); ++i) EXPECT_EQ(at[i], own[i]) << "operand " << i << (split ? ", split" : "");
  }
  vk::Buffer small = ok_or_throw(rt.alloc(n * H * D * 4, "q"));
  vk::Buffer big = ok_or_throw(rt.alloc(B * L * H * D * 4, "big"));
  auto seq = ok_or_throw(rt.new_sequence());
  Status s = vk::attention(seq, {B, L, H, Hkv, D}, begin, W, small, big, big, nullptr, big, nullptr, {1, 0, 0, 0, 0});
  EXPECT_NE(s.message().find("q [B, W, n_head, head_dim]"), std::string::npos) << s.message();
  s = vk::rope_kv(seq, small, big, n, H, Hkv, D, big, big, nullptr, nullptr, nullptr, nullptr, {0, 0, 0, B * L * H * D, 0});
  EXPECT_NE(s.message().find("cos [n, head_dim/2]"), std::string::npos) << s.message();
}

// The fused RoPE + KV-cache store (kernels.h rope_kv) against the CPU's rope_apply on q and k then kv_store of k
// and v: GQA (3 query heads, 1 KV head of 10: a half of 5), a window [4, 10) of 3 rows in a sequence of 13, and
// without the store (the refresh and uncached forwards); the cache outside the window is untouched.
TEST(VulkanKernels, RopeKvAgainstTheCpu) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t B = 3, L = 13, H = 3, Hkv = 1, D = 10, begin = 4, W = 6, n = B * W, C = Hkv * D;
  const std::vector<float> cos_t = random_floats(1, static_cast<size_t>(n * D / 2)), sin_t = random_floats(2, static_cast<size_t>(n * D / 2));
  for (const bool store : {true, false}) {
    std::vector<float> q = random_floats(3, static_cast<size_t>(n * H * D)), k = random_floats(4, static_cast<size_t>(n * C));
    const std::vector<float> v = random_floats(5, static_cast<size_t>(n * C));
    std::vector<float> cache_k = random_floats(6, static_cast<size_t>(B * L * C)), cache_v = random_floats(7, static_cast<size_t>(B * L * C));
    vk::Buffer dq = ok_or_throw(rt.make_buffer(q, "q")), dk = ok_or_throw(rt.make_buffer(k, "k")), dv = ok_or_throw(rt.make_buffer(v, "v"));
    vk::Buffer dck = ok_or_throw(rt.make_buffer(cache_k, "cache k")), dcv = ok_or_throw(rt.make_buffer(cache_v, "cache v"));
    const vk::Buffer dcos = ok_or_throw(rt.make_buffer(cos_t, "cos")), dsin = ok_or_throw(rt.make_buffer(sin_t, "sin"));
    const AttentionShape shape{B, L, H, Hkv, D};
    rope_kv(cpu_reference(), shape, begin, W, q.data(), k.data(), v.data(), cos_t.data(), sin_t.data(),
            store ? cache_k.data() : nullptr, store ? cache_v.data() : nullptr);
    const vk::KvWindow window{B, L, begin, W};
    auto seq = ok_or_throw(rt.new_sequence());
    ok_or_throw(vk::rope_kv(seq, dq, dk, n, H, Hkv, D, dcos, dsin, store ? &window : nullptr, &dv, &dck, &dcv));
    EXPECT_EQ(seq.dispatches(), 1);
    ok_or_throw(seq.run());
    const std::string what = store ? "with the store" : "without";
    expect_close(q, ok_or_throw(rt.read<float>(dq, n * H * D)), 1e-6, "q " + what);
    expect_close(k, ok_or_throw(rt.read<float>(dk, n * C)), 1e-6, "k " + what);
    expect_close(cache_k, ok_or_throw(rt.read<float>(dck, B * L * C)), 1e-6, "cache k " + what);
    EXPECT_EQ(ok_or_throw(rt.read<float>(dcv, B * L * C)), cache_v) << what;
  }
  vk::Buffer q = ok_or_throw(rt.alloc(n * H * D * 4, "q")), k = ok_or_throw(rt.alloc(n * C * 4, "k"));
  const vk::Buffer cs = ok_or_throw(rt.alloc(n * D / 2 * 4, "cos"));
  vk::Buffer cache = ok_or_throw(rt.alloc(B * L * C * 4, "cache"));
  auto seq = ok_or_throw(rt.new_sequence());
  const vk::KvWindow beyond{B, L, 9, W};  // past L
  EXPECT_EQ(vk::rope_kv(seq, q, k, n, H, Hkv, D, cs, cs, &beyond, &k, &cache, &cache).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(vk::rope_kv(seq, q, k, n, H, Hkv, D, cs, cs, &beyond, nullptr, &cache, &cache).code(), StatusCode::kInvalidArgument);
}

// sample_rows over logits [n, V] (on the device as dl) with filter f, the draws those of the streams
// (7, kTest, fi, row), checked row by row against sample_token: the same token, each confidence within 2e-5
// (the entropy within entropy_tol: an f32 sum over the survivors). Returns the device's ids [n] and conf [n, 3].
std::pair<std::vector<uint32_t>, std::vector<float>> sample_rows_against_the_sampler(vk::Runtime& rt, const std::vector<float>& logits,
                                                                                   const vk::Buffer& dl, int64_t n, int64_t V,
                                                                                   const FilterConfig& f, int64_t fi, double entropy_tol) {
  std::vector<float> u(n);
  for (int64_t r = 0; r < n; ++r) {
    Rng rng = Rng::for_stream(7, RngPurpose::kTest, fi, r, 0);
    u[r] = std::min(static_cast<float>(rng.uniform_double()), std::nextafter(1.0f, 0.0f));
  }
  const vk::Buffer du = ok_or_throw(rt.make_buffer(u, "uniforms"));
  vk::Buffer ids = ok_or_throw(rt.alloc(n * 4, "ids")), conf = ok_or_throw(rt.alloc(n * 12, "conf"));
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::sample_rows(seq, dl, n, V, {f.temperature, f.top_p, f.top_k}, du, ids, conf));
  ok_or_throw(seq.run());
  std::vector<uint32_t> got_ids = ok_or_throw(rt.read<uint32_t>(ids, n));
  std::vector<float> got = ok_or_throw(rt.read<float>(conf, n * 3));
  const ConfidenceKind kinds[3] = {ConfidenceKind::kProbability, ConfidenceKind::kMargin, ConfidenceKind::kNegEntropy};
  for (int64_t r = 0; r < n; ++r) {
    const std::string what = "filter " + std::to_string(fi) + " row " + std::to_string(r);
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> row(logits.begin() + r * V, logits.begin() + (r + 1) * V);
      FilterScratch scratch;
      Rng rng = Rng::for_stream(7, RngPurpose::kTest, fi, r, 0);
      const TokenSample want = ok_or_throw(sample_token(row.data(), V, f, kinds[kind], rng, scratch));
      EXPECT_EQ(got_ids[r], static_cast<uint32_t>(want.token)) << what;
      EXPECT_NEAR(got[r * 3 + kind], want.confidence, kind == 2 ? entropy_tol : 2e-5) << what << " kind " << kind;
    }
  }
  return {std::move(got_ids), std::move(got)};
}

// The device's sampling step against the sampler's sample_token on crafted rows, for temperature 0 and > 0
// (the draw: the stream's uniform_double, as the device head sampler uploads it), top-k (1, with ties at the
// threshold, beyond the vocabulary) and top-p (a mass exactly at top_p, a cut inside a tie group): the same
// token, confidences within 2e-5. Rows: random; a tie at the top; half the tokens −inf; four tied tokens and
// the rest −inf; a flat row (1024 ties); integer logits (ties everywhere).
TEST(VulkanKernels, SampleRowsAgainstTheSampler) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 6, V = 1024;
  std::vector<float> logits = random_floats(9, static_cast<size_t>(n * V), -8, 8);
  logits[1 * V + 700] = logits[1 * V + 300] = 20.0f;                 // a tie: the lower id first
  for (int64_t c = 0; c < V; c += 2) logits[2 * V + c] = -INFINITY;  // −inf tokens get probability 0
  for (int64_t c = 0; c < V; ++c) logits[3 * V + c] = c % 10 == 0 && c > 0 && c <= 40 ? 0.0f : -INFINITY;
  for (int64_t c = 0; c < V; ++c) logits[4 * V + c] = 1.5f;
  for (int64_t c = 0; c < V; ++c) logits[5 * V + c] = std::floor(logits[5 * V + c]);
  const FilterConfig filters[] = {{0.0f, 1.0f, 0},  {0.7f, 1.0f, 0},  {1.0f, 0.9f, 0}, {0.7f, 0.9f, 50}, {1.0f, 1.0f, 1},
                                  {1.0f, 1.0f, 5000}, {0.0f, 0.5f, 20}, {1.0f, 0.5f, 0}, {1.3f, 0.3f, 0},  {1.0f, 1.0f, 10}};
  const vk::Buffer dl = ok_or_throw(rt.make_buffer(logits, "logits"));
  for (size_t fi = 0; fi < std::size(filters); ++fi) {
    const FilterConfig& f = filters[fi];
    const auto [got_ids, got] = sample_rows_against_the_sampler(rt, logits, dl, n, V, f, static_cast<int64_t>(fi), 2e-5);
    if (f.temperature == 0.0f) {
      EXPECT_EQ(got_ids[1], 300u);
    }
    if (f.top_p == 0.5f) {  // row 3: ids 10..40 at 1/4 each; the mass reaches 0.5 after two (not above): three kept
      EXPECT_NEAR(got[3 * 3], 1.0f / 3.0f, 1e-6);
      EXPECT_LT(got_ids[3], 40u);
    }
    if (f.top_p == 0.3f) {
      EXPECT_LT(got_ids[4], 308u);  // row 4: 308 of the 1024 ties (307 / 1024 <= 0.3)
    }
    if (f.top_k == 1) {  // row 0: only the top token; row 1: both tokens tied at the top (ties at the k-th kept)
      EXPECT_EQ(got[0], 1.0f);
      EXPECT_EQ(got[1 * 3], 0.5f);
    }
  }
  // A NaN, a +inf and every logit −inf (the sampler's errors): confidences that are not finite, which the
  // device head sampler reports as that error.
  std::vector<float> broken(3 * V, 0.5f);
  broken[10] = NAN, broken[V + 3] = INFINITY;
  std::fill(broken.begin() + 2 * V, broken.end(), -INFINITY);
  const vk::Buffer dead = ok_or_throw(rt.make_buffer(broken, "broken rows"));
  vk::Buffer ids = ok_or_throw(rt.alloc(3 * 4, "ids")), conf = ok_or_throw(rt.alloc(3 * 12, "conf"));
  const vk::Buffer du = ok_or_throw(rt.make_buffer(std::vector<float>(3, 0.5f), "uniforms"));
  auto seq = ok_or_throw(rt.new_sequence());
  ok_or_throw(vk::sample_rows(seq, dead, 3, V, {1.0f, 0.9f, 5}, du, ids, conf));
  ok_or_throw(seq.run());
  for (float x : ok_or_throw(rt.read<float>(conf, 9))) EXPECT_FALSE(std::isfinite(x)) << x;
  EXPECT_EQ(vk::sample_rows(seq, dead, 3, V, {-1.0f, 1.0f, 0}, du, ids, conf).code(), StatusCode::kInvalidArgument);
}

// The same at Qwen's vocabulary (V = 152064 > 2^17), where lavapipe once ended the shader's loops early (its
// 65535-iteration limit over all of an invocation's loops: wrong sums, token 131072 = 2^17 drawn) whenever
// top-p was on, and a tie group's draw walked the group one token at a time. Rows: random; near-uniform
// (|z| < 0.01); eight values (tie groups of ~19k); flat (every token tied); 153 tokens tied above a flat rest.
// Filters: top-k with top-p, top-p alone, top-k alone. A row too long for lavapipe's limit is refused.
TEST(VulkanKernels, SampleRowsAgainstTheSamplerAtAFullVocabulary) {
  vk::Runtime& rt = vulkan_runtime();
  const int64_t n = 5, V = 152064;
  std::vector<float> logits = random_floats(11, static_cast<size_t>(n * V), -8, 8);
  for (int64_t c = 0; c < V; ++c) {
    logits[1 * V + c] /= 800.0f;
    logits[2 * V + c] = std::floor(logits[2 * V + c] / 2.0f) / 4.0f;
    logits[3 * V + c] = 0.25f;
    logits[4 * V + c] = c % 1000 == 7 ? 3.0f : 0.0f;
  }
  const FilterConfig filters[] = {{1.0f, 0.95f, 5}, {1.0f, 0.99f, 50}, {0.7f, 0.5f, 20}, {1.0f, 0.95f, 0}, {1.0f, 1.0f, 5}};
  const vk::Buffer dl = ok_or_throw(rt.make_buffer(logits, "logits"));
  for (size_t fi = 0; fi < std::size(filters); ++fi)  // the entropy (≈ −12): Σ of 152k f32 terms, measured 5e-5 off
    sample_rows_against_the_sampler(rt, logits, dl, n, V, filters[fi], static_cast<int64_t>(fi), 1e-4);
  if (rt.info().type == "CPU") {  // 2^20 tokens: past what 1024 invocations can do under lavapipe's limit
    const int64_t long_v = int64_t{1} << 20;
    const vk::Buffer dlong = ok_or_throw(rt.alloc(long_v * 4, "a long row"));
    const vk::Buffer du = ok_or_throw(rt.make_buffer(std::vector<float>(1, 0.5f), "uniforms"));
    vk::Buffer ids = ok_or_throw(rt.alloc(4, "ids")), conf = ok_or_throw(rt.alloc(12, "conf"));
    auto seq = ok_or_throw(rt.new_sequence());
    const Status s = vk::sample_rows(seq, dlong, 1, long_v, {1.0f, 0.9f, 5}, du, ids, conf);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("n_vocab 1048576"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace dc
