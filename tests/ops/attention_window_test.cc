// attention_window against attention(): every window of a few sequences (with and without a left-padding
// mask, GQA 1/2/4, 1 and 3 threads) reproduces the window's rows of the full attention. The fast window
// kernel against the reference one (Context::reference_kernels) on random inputs: tolerance 1e-5 relative
// to the largest reference magnitude, bitwise the same on 1 and 3 threads, and with W = L bitwise what
// the fast attention() computes. Queries at scattered positions (cache committed) equal those positions' rows
// of the full attention, padding included, with both kernels; kv_store writes a scattered window's rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "ops/attention.h"
#include "ops/attention_window.h"
#include "ops/cpu/kernels.h"

namespace dc {
namespace {

using dc::testing::expect_close;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

class AttentionWindowTest : public ::testing::TestWithParam<int> {};

TEST_P(AttentionWindowTest, EveryWindowMatchesTheFullAttentionRows) {
  ThreadPool pool(GetParam());
  const Context ctx{Device::kCpu, &pool};
  struct Shape {
    int64_t B, L, H, Hkv, D;
  };
  for (const Shape& sh : {Shape{1, 9, 2, 2, 8}, Shape{2, 7, 4, 2, 4}, Shape{3, 6, 4, 1, 16}}) {
    const AttentionShape s{sh.B, sh.L, sh.H, sh.Hkv, sh.D};
    const int64_t qd = sh.H * sh.D, kd = sh.Hkv * sh.D;
    const auto q = random_values(sh.B * sh.L * qd, 1), k = random_values(sh.B * sh.L * kd, 2),
               v = random_values(sh.B * sh.L * kd, 3);
    std::vector<uint8_t> pads(sh.B * sh.L, 1);  // row b has b left pads
    for (int64_t b = 0; b < sh.B; ++b)
      for (int64_t i = 0; i < b; ++i) pads[b * sh.L + i] = 0;
    for (const uint8_t* valid : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(pads.data())}) {
      std::vector<float> full(sh.B * sh.L * qd);
      attention(ctx, s, q.data(), k.data(), v.data(), valid, full.data());
      double max_abs = 0;
      for (float x : full) max_abs = std::max(max_abs, static_cast<double>(std::abs(x)));
      for (int64_t wb = 0; wb < sh.L; ++wb)
        for (int64_t we = wb + 1; we <= sh.L; ++we) {
          const int64_t W = we - wb;
          std::vector<float> qw(sh.B * W * qd), out(sh.B * W * qd, -1.0f);
          for (int64_t b = 0; b < sh.B; ++b)
            std::copy_n(q.data() + (b * sh.L + wb) * qd, W * qd, qw.data() + b * W * qd);
          attention_window(ctx, s, wb, W, qw.data(), k.data(), v.data(), valid, out.data());
          for (int64_t b = 0; b < sh.B; ++b)
            for (int64_t i = 0; i < W; ++i)
              for (int64_t t = 0; t < qd; ++t) {
                const float want = full[(b * sh.L + wb + i) * qd + t], got = out[(b * W + i) * qd + t];
                ASSERT_NEAR(got, want, 1e-6 * max_abs)
                    << "B " << sh.B << " L " << sh.L << " window [" << wb << ", " << we << ") row " << b
                    << " query " << wb + i << " element " << t << (valid ? " (padded)" : "");
              }
        }
    }
  }
}

TEST_P(AttentionWindowTest, PadQueriesGetZeroOutput) {
  ThreadPool pool(GetParam());
  const Context ctx{Device::kCpu, &pool};
  const AttentionShape s{1, 5, 2, 1, 4};
  const auto q = random_values(2 * 8, 4), k = random_values(5 * 4, 5), v = random_values(5 * 4, 6);
  const std::vector<uint8_t> valid = {0, 0, 1, 1, 1};
  std::vector<float> out(2 * 8, 7.0f);
  attention_window(ctx, s, 1, 2, q.data(), k.data(), v.data(), valid.data(), out.data());
  for (int t = 0; t < 8; ++t) EXPECT_EQ(out[t], 0.0f) << "pad query element " << t;
  for (int t = 8; t < 16; ++t) EXPECT_TRUE(std::isfinite(out[t]) && out[t] != 7.0f) << "real query element " << t;
}

TEST_P(AttentionWindowTest, ScatteredQueriesMatchTheFullAttentionRows) {
  ThreadPool pool(GetParam());
  Context fast{Device::kCpu, &pool}, ref{Device::kCpu, &pool};
  ref.reference_kernels = true;
  const int64_t B = 2, L = 13, H = 4, Hkv = 2, D = 64, qd = H * D, kd = Hkv * D;
  const AttentionShape s{B, L, H, Hkv, D};
  const auto q = random_values(B * L * qd, 11), k = random_values(B * L * kd, 12), v = random_values(B * L * kd, 13);
  std::vector<uint8_t> valid(B * L, 1);
  for (int64_t i = 0; i < 4; ++i) valid[L + i] = 0;  // row 1: 4 left pads
  std::vector<float> full(B * L * qd);
  attention(ref, s, q.data(), k.data(), v.data(), valid.data(), full.data());
  double max_abs = 0;
  for (float x : full) max_abs = std::max(max_abs, static_cast<double>(std::abs(x)));
  // Sets inside windows from 2: pad queries of row 1 (2, 3) among them, gaps, the last position.
  for (const std::vector<int64_t>& at : {std::vector<int64_t>{2, 3, 5, 9, 12}, {4}, {6, 7, 8, 10, 11, 12}}) {
    const int64_t W = static_cast<int64_t>(at.size());
    std::vector<float> qw(B * W * qd);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < W; ++i) std::copy_n(q.data() + (b * L + at[i]) * qd, qd, qw.data() + (b * W + i) * qd);
    for (const Context* ctx : {&ref, &fast}) {
      std::vector<float> out(B * W * qd, NAN);
      attention_window(*ctx, s, 2, W, qw.data(), k.data(), v.data(), valid.data(), out.data(), at.data());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < W; ++i)
          for (int64_t t = 0; t < qd; ++t)
            ASSERT_NEAR(out[(b * W + i) * qd + t], full[(b * L + at[i]) * qd + t], 1e-5 * max_abs)
                << (ctx == &ref ? "reference" : "fast") << " row " << b << " query " << at[i] << " element " << t;
    }
  }
  // kv_store of a scattered window: only its positions change.
  const int64_t cols = 3;
  std::vector<float> cache(B * L * cols, -1.0f), src(B * 2 * cols);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  const std::vector<int64_t> at = {4, 9};
  kv_store(fast, src.data(), B, L, 3, 2, cols, cache.data(), at.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t slot = i == 4 ? 0 : i == 9 ? 1 : -1;
        const float want = slot < 0 ? -1.0f : src[(b * 2 + slot) * cols + c];
        ASSERT_EQ(cache[(b * L + i) * cols + c], want) << "row " << b << " position " << i << " column " << c;
      }
}

struct FastCase {
  int64_t B, L, H, Hkv, D;
  int pattern;  // 0: no mask; 1: left padding (row b has 2b + 1 pads); 2: random holes, row 1 all invalid
};

TEST_P(AttentionWindowTest, FastKernelMatchesReference) {
  ThreadPool pool(GetParam()), one(1);
  Context fast{Device::kCpu, &pool}, fast1{Device::kCpu, &one}, ref{Device::kCpu, &pool};
  ref.reference_kernels = true;
  const FastCase cases[] = {
      {1, 1, 2, 1, 64, 0},   {2, 7, 6, 6, 40, 1},   {2, 33, 14, 2, 64, 2},  {2, 65, 4, 2, 128, 2},
      {1, 280, 7, 1, 64, 0}, {2, 300, 14, 2, 40, 1}, {1, 257, 4, 4, 128, 2}, {3, 97, 28, 4, 128, 1},
  };
  for (const FastCase& c : cases) {
    const AttentionShape s{c.B, c.L, c.H, c.Hkv, c.D};
    const int64_t B = c.B, L = c.L, qd = c.H * c.D, kd = c.Hkv * c.D;
    const auto k = random_values(B * L * kd, 2), v = random_values(B * L * kd, 3);
    std::vector<uint8_t> valid(B * L, 1);
    std::mt19937 gen(9);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i) {
        if (c.pattern == 1) valid[b * L + i] = i > 2 * b;
        if (c.pattern == 2) valid[b * L + i] = b == 1 ? 0 : (gen() % 4 != 0);
      }
    const uint8_t* mask = c.pattern == 0 ? nullptr : valid.data();
    // Windows [wb, wb + W): the whole sequence, W = 1 at the start, middle and end, short and long windows.
    const int64_t third = std::max<int64_t>(1, L / 3), tail = std::min<int64_t>(L, 17);
    const std::pair<int64_t, int64_t> windows[] = {
        {0, L}, {0, 1}, {L / 2, 1}, {L - 1, 1}, {0, std::min<int64_t>(L, 9)}, {L / 3, third}, {L - tail, tail}};
    for (const auto& [wb, W] : windows) {
      const std::string what = "B=" + std::to_string(B) + " L=" + std::to_string(L) + " H=" + std::to_string(c.H) +
                               "/" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + " pattern " +
                               std::to_string(c.pattern) + " window [" + std::to_string(wb) + ", " +
                               std::to_string(wb + W) + ")";
      const auto q = random_values(B * W * qd, static_cast<uint32_t>(1 + wb * 1000 + W));
      std::vector<float> want(q.size(), NAN), got(q.size(), NAN), got1(q.size(), NAN);
      attention_window(ref, s, wb, W, q.data(), k.data(), v.data(), mask, want.data());
      attention_window(fast, s, wb, W, q.data(), k.data(), v.data(), mask, got.data());
      attention_window(fast1, s, wb, W, q.data(), k.data(), v.data(), mask, got1.data());
      expect_close(want, got, 1e-5, what);
      ASSERT_EQ(got, got1) << what << ": result depends on the thread count";
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < W; ++i) {
          if (!mask || mask[b * L + wb + i]) continue;
          for (int64_t t = 0; t < qd; ++t)
            ASSERT_EQ(got[(b * W + i) * qd + t], 0.0f) << what << ": masked query " << wb + i << " of row " << b;
        }
      if (W == L) {
        std::vector<float> full(q.size(), NAN);
        attention(fast, s, q.data(), k.data(), v.data(), mask, full.data());
        ASSERT_EQ(got, full) << what << ": the whole window differs from attention()";
      }
      cpu::force_portable_kernels_for_testing(true);  // without AVX-512: the reference kernel
      attention_window(fast, s, wb, W, q.data(), k.data(), v.data(), mask, got.data());
      cpu::force_portable_kernels_for_testing(false);
      ASSERT_EQ(got, want) << what << ": the portable fallback differs from the reference kernel";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, AttentionWindowTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace dc
