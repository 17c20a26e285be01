// attention_window against attention(): every window of a few sequences (with and without a left-padding
// mask, GQA 1/2/4, 1 and 3 threads) reproduces the window's rows of the full attention.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/attention_window.h"

namespace dc {
namespace {

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

INSTANTIATE_TEST_SUITE_P(Threads, AttentionWindowTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace dc
