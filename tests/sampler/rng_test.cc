// The seeded RNG: reproducibility, stream independence, uniform ranges, categorical and
// without-replacement sampling frequencies (5-sigma bounds).
#include "sampler/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

namespace dc {
namespace {

// |observed − n·p| within 5 standard deviations of a binomial count.
void expect_count(int64_t observed, int64_t n, double p, const std::string& what) {
  const double mean = n * p;
  const double sd = std::sqrt(n * p * (1.0 - p));
  EXPECT_LE(std::abs(observed - mean), 5.0 * sd + 1e-9) << what << ": observed " << observed << " expected " << mean;
}

TEST(Rng, SameSeedSameSequenceDifferentSeedDifferent) {
  Rng a(42), b(42), c(43);
  bool any_diff = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    any_diff |= x != c.next_u64();
  }
  EXPECT_TRUE(any_diff);
}

TEST(Rng, StreamsDependOnEveryKeyField) {
  const uint64_t base = Rng::for_stream(7, RngPurpose::kToken, 3, 1, 5).next_u64();
  EXPECT_EQ(base, Rng::for_stream(7, RngPurpose::kToken, 3, 1, 5).next_u64());
  EXPECT_NE(base, Rng::for_stream(8, RngPurpose::kToken, 3, 1, 5).next_u64());
  EXPECT_NE(base, Rng::for_stream(7, RngPurpose::kTransfer, 3, 1, 5).next_u64());
  EXPECT_NE(base, Rng::for_stream(7, RngPurpose::kToken, 4, 1, 5).next_u64());
  EXPECT_NE(base, Rng::for_stream(7, RngPurpose::kToken, 3, 2, 5).next_u64());
  EXPECT_NE(base, Rng::for_stream(7, RngPurpose::kToken, 3, 1, 6).next_u64());
  EXPECT_NE(Rng::for_stream(0, RngPurpose::kToken, 1, 0, 0).next_u64(),
            Rng::for_stream(0, RngPurpose::kToken, 0, 1, 0).next_u64());
  // Many neighbouring streams give distinct first draws.
  std::set<uint64_t> seen;
  for (int step = 0; step < 16; ++step)
    for (int row = 0; row < 8; ++row)
      for (int pos = 0; pos < 64; ++pos) seen.insert(Rng::for_stream(0, RngPurpose::kToken, step, row, pos).next_u64());
  EXPECT_EQ(seen.size(), 16u * 8u * 64u);
}

TEST(Rng, UniformRangesAndMean) {
  Rng rng(1);
  double sum_f = 0.0, sum_d = 0.0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float f = rng.uniform_float();
    const double d = rng.uniform_double();
    ASSERT_GE(f, 0.0f);
    ASSERT_LT(f, 1.0f);
    ASSERT_GE(d, 0.0);
    ASSERT_LT(d, 1.0);
    sum_f += f;
    sum_d += d;
  }
  const double sd = std::sqrt(1.0 / 12.0 / n);
  EXPECT_NEAR(sum_f / n, 0.5, 5 * sd);
  EXPECT_NEAR(sum_d / n, 0.5, 5 * sd);
}

TEST(SampleCategorical, FrequenciesAndZeroProbabilities) {
  const std::vector<float> probs{0.5f, 0.0f, 0.3f, 0.15f, 0.05f, 0.0f};
  std::vector<int64_t> counts(probs.size(), 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Rng rng = Rng::for_stream(3, RngPurpose::kTest, 0, i, 0);
    ++counts[static_cast<size_t>(sample_categorical(probs, rng))];
  }
  for (size_t v = 0; v < probs.size(); ++v) {
    if (probs[v] == 0.0f) {
      EXPECT_EQ(counts[v], 0) << "token " << v;
    } else {
      expect_count(counts[v], n, probs[v], "token " + std::to_string(v));
    }
  }
}

TEST(SampleCategorical, UnnormalisedAndSingleton) {
  const std::vector<float> probs{2.0f, 6.0f};  // 1:3
  int64_t ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Rng rng = Rng::for_stream(4, RngPurpose::kTest, 0, i, 0);
    ones += sample_categorical(probs, rng);
  }
  expect_count(ones, n, 0.75, "token 1");
  Rng rng(0);
  const std::vector<float> one{0.0f, 0.0f, 1e-30f};
  EXPECT_EQ(sample_categorical(one, rng), 2);
}

TEST(SampleWithoutReplacement, DistinctAndDrawOrderFrequencies) {
  // weights 0.5, 0.3, 0.2: P(first = i) = w_i; P(set {i, j}) = w_i w_j/(1−w_i) + w_j w_i/(1−w_j).
  const std::vector<double> w{0.5, 0.3, 0.2};
  const std::vector<float> log_w{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const int n = 20000;
  std::vector<int64_t> first(3, 0);
  std::map<std::pair<int64_t, int64_t>, int64_t> pairs;
  for (int i = 0; i < n; ++i) {
    Rng rng = Rng::for_stream(5, RngPurpose::kTest, 0, i, 0);
    const std::vector<int64_t> got = sample_without_replacement(log_w, 2, rng);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_NE(got[0], got[1]);
    ++first[static_cast<size_t>(got[0])];
    ++pairs[{std::min(got[0], got[1]), std::max(got[0], got[1])}];
  }
  for (int i = 0; i < 3; ++i) expect_count(first[i], n, w[i], "first draw " + std::to_string(i));
  for (int i = 0; i < 3; ++i) {
    for (int j = i + 1; j < 3; ++j) {
      const double p = w[i] * w[j] / (1 - w[i]) + w[j] * w[i] / (1 - w[j]);
      expect_count(pairs[{i, j}], n, p, "pair " + std::to_string(i) + "," + std::to_string(j));
    }
  }
}

TEST(SampleWithoutReplacement, EdgeCases) {
  Rng rng(9);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> log_w{-inf, 0.0f, -inf, 1.0f};
  const std::vector<int64_t> all = sample_without_replacement(log_w, 4, rng);
  ASSERT_EQ(all.size(), 4u);
  // The finite ones come first; the −inf ones after, in index order.
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.begin() + 2), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(all[2], 0);
  EXPECT_EQ(all[3], 2);
  EXPECT_TRUE(sample_without_replacement(log_w, 0, rng).empty());
}

}  // namespace
}  // namespace dc
