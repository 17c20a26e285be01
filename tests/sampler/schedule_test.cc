// The time grid and per-step transfer counts against the values in spec §3.4.
#include "sampler/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

namespace dc {
namespace {

// Simulates one row's masked count through the schedule, like Dream's loop with no hooks.
std::vector<int64_t> simulate(int64_t new_tokens, int steps) {
  const std::vector<float> t = timesteps(steps, 1e-3f);
  std::vector<int64_t> ks;
  int64_t masked = new_tokens;
  for (int i = 0; i < steps; ++i) {
    const int64_t k = transfer_count(static_cast<float>(masked), t[i], t[i + 1], i == steps - 1);
    ks.push_back(k);
    masked -= k;
  }
  return ks;
}

std::vector<int64_t> expected(int64_t first, int64_t middle, int n_middle, int64_t last) {
  std::vector<int64_t> v{first};
  v.insert(v.end(), n_middle, middle);
  v.push_back(last);
  return v;
}

TEST(Timesteps, EndpointsExactAndCloseToLinspace) {
  for (int steps : {1, 2, 7, 64, 128, 256, 512, 1000}) {
    const std::vector<float> t = timesteps(steps, 1e-3f);
    ASSERT_EQ(t.size(), static_cast<size_t>(steps) + 1);
    EXPECT_EQ(t.front(), 1.0f);
    EXPECT_EQ(t.back(), 1e-3f);
    for (int i = 0; i <= steps; ++i) {
      const double exact = 1.0 + (1e-3 - 1.0) * i / steps;
      EXPECT_NEAR(t[i], exact, 2e-7) << "steps " << steps << " i " << i;
      if (i > 0) {
        EXPECT_LT(t[i], t[i - 1]) << "steps " << steps << " i " << i;
      }
    }
  }
}

TEST(Timesteps, HalvesUseTorchFormula) {
  // PyTorch: i < n/2 → start + step·i, else end − step·(n−1−i), f32 without FMA.
  const int steps = 256;
  const int64_t n = steps + 1;
  const std::vector<float> t = timesteps(steps, 1e-3f);
  const float step = (1e-3f - 1.0f) / static_cast<float>(n - 1);
  for (int64_t i = 0; i < n; ++i) {
    volatile float prod = i < n / 2 ? step * static_cast<float>(i) : step * static_cast<float>(n - 1 - i);
    const float want = i < n / 2 ? 1.0f + prod : 1e-3f - prod;
    EXPECT_EQ(t[i], want) << "i " << i;
  }
}

TEST(TransferCount, SpecExamples) {
  EXPECT_EQ(simulate(256, 256), expected(0, 1, 254, 2));
  EXPECT_EQ(simulate(512, 512), expected(0, 1, 510, 2));
  EXPECT_EQ(simulate(256, 128), expected(1, 2, 126, 3));
  EXPECT_EQ(simulate(256, 64), expected(3, 4, 62, 5));
  for (auto [n, steps] : {std::pair{256, 256}, {512, 512}, {256, 128}, {256, 64}, {100, 7}, {5, 20}}) {
    const std::vector<int64_t> ks = simulate(n, steps);
    EXPECT_EQ(std::accumulate(ks.begin(), ks.end(), int64_t{0}), n) << n << "/" << steps;
  }
}

TEST(TransferCount, TruncatesAndLastStepTakesAll) {
  EXPECT_EQ(transfer_count(10.0f, 1.0f, 0.5f, false), 5);
  EXPECT_EQ(transfer_count(9.0f, 1.0f, 0.5f, false), 4);  // 4.5 → 4
  EXPECT_EQ(transfer_count(9.5f, 1.0f, 0.5f, true), 9);   // batch average 9.5 → 9
  EXPECT_EQ(transfer_count(0.0f, 1.0f, 0.5f, false), 0);
  EXPECT_EQ(origin_transfer_probability(1.0f, 0.5f, false), 0.5f);
  EXPECT_EQ(origin_transfer_probability(1.0f, 0.5f, true), 1.0f);
}

}  // namespace
}  // namespace dc
