// Temperature / top-p / top-k / softmax / confidences on crafted rows, the fused path against a dense
// double-precision reference of spec §3.5, and sampled frequencies after the filters.
#include "sampler/filters.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "sampler/fake_model.h"

namespace dc {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Spec §3.5 written densely and independently: f32 division by T (as the engine), then in double:
// full stable sort, softmax, cumsum, shifted removal, k-th largest threshold, softmax of the rest.
std::vector<double> reference_probs(const std::vector<float>& logits, float temperature, float top_p, int64_t top_k) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<double> x(logits.size());
  for (int64_t i = 0; i < n; ++i) x[i] = temperature > 0 ? logits[i] / temperature : logits[i];
  std::vector<bool> removed(logits.size(), false);
  if (top_p < 1.0f) {
    std::vector<int64_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[a] > x[b]; });
    const double mx = x[order[0]];
    double z = 0.0;
    for (double v : x) z += std::exp(v - mx);
    double c = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (i > 0 && static_cast<float>(c) > top_p) removed[order[i]] = true;
      c += std::exp(x[order[i]] - mx) / z;
    }
  }
  if (top_k > 0 && top_k < n) {
    std::vector<double> kept;
    for (int64_t i = 0; i < n; ++i) kept.push_back(removed[i] ? -INFINITY : x[i]);
    std::sort(kept.begin(), kept.end(), std::greater<double>());
    const double threshold = kept[top_k - 1];
    for (int64_t i = 0; i < n; ++i) {
      if (!removed[i] && x[i] < threshold) removed[i] = true;
    }
  }
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (!removed[i]) mx = std::max(mx, x[i]);
  std::vector<double> p(logits.size(), 0.0);
  double z = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!removed[i]) z += (p[i] = std::exp(x[i] - mx));
  }
  for (double& v : p) v /= z;
  return p;
}

// The fused path's distribution as a dense vector (0 for tokens that did not survive).
std::vector<double> fused_probs(std::vector<float> logits, float temperature, float top_p, int64_t top_k) {
  FilterScratch scratch;
  const FilterConfig config{temperature, top_p, top_k};
  Status st = filtered_distribution(logits.data(), static_cast<int64_t>(logits.size()), config, scratch);
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::vector<double> p(logits.size(), 0.0);
  std::set<int32_t> ids(scratch.ids.begin(), scratch.ids.end());
  EXPECT_EQ(ids.size(), scratch.ids.size()) << "duplicate survivor ids";
  for (size_t i = 0; i < scratch.ids.size(); ++i) p[scratch.ids[i]] = scratch.probs[i];
  return p;
}

std::set<int> support(const std::vector<double>& p) {
  std::set<int> s;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) s.insert(static_cast<int>(i));
  return s;
}

std::set<int> finite(const std::vector<float>& x) {
  std::set<int> s;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] > -kInf) s.insert(static_cast<int>(i));
  return s;
}

TEST(TopP, CrossingTokenAndTopTokenKept) {
  // Logits 3, 2, 1, 0 at ids 2, 0, 3, 1: softmax 0.644, 0.237, 0.087, 0.032 in that order.
  const std::vector<float> logits{2.0f, 0.0f, 3.0f, 1.0f};
  FilterScratch scratch;
  auto run = [&](float top_p) {
    std::vector<float> x = logits;
    top_p_filter(x.data(), 4, top_p, scratch);
    for (int i : finite(x)) EXPECT_EQ(x[i], logits[i]);
    return finite(x);
  };
  EXPECT_EQ(run(0.01f), (std::set<int>{2}));        // the top token always survives
  EXPECT_EQ(run(0.5f), (std::set<int>{2}));         // c0 = 0.644 crosses 0.5: only token 0 of the order
  EXPECT_EQ(run(0.7f), (std::set<int>{2, 0}));      // c1 = 0.881 crosses: the crossing token is kept
  EXPECT_EQ(run(0.9f), (std::set<int>{2, 0, 3}));   // c2 = 0.968 crosses at the third token
  EXPECT_EQ(run(0.99f), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(run(1.0f), (std::set<int>{0, 1, 2, 3}));  // off
  for (float top_p : {0.01f, 0.5f, 0.7f, 0.9f, 0.99f}) {
    EXPECT_EQ(support(fused_probs(logits, 0.0f, top_p, 0)), run(top_p)) << top_p;
  }
}

TEST(TopK, TiesAtThresholdKept) {
  const std::vector<float> logits{1.0f, 5.0f, 5.0f, 3.0f, 5.0f, 0.0f};
  FilterScratch scratch;
  auto run = [&](int64_t k) {
    std::vector<float> x = logits;
    top_k_filter(x.data(), 6, k, scratch);
    return finite(x);
  };
  EXPECT_EQ(run(1), (std::set<int>{1, 2, 4}));
  EXPECT_EQ(run(2), (std::set<int>{1, 2, 4}));
  EXPECT_EQ(run(4), (std::set<int>{1, 2, 3, 4}));
  EXPECT_EQ(run(6), (std::set<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(run(100), (std::set<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(run(0), (std::set<int>{0, 1, 2, 3, 4, 5}));
  for (int64_t k : {1, 2, 3, 4, 5, 6, 100, 0, -1}) {
    EXPECT_EQ(support(fused_probs(logits, 1.0f, 1.0f, k)), run(k)) << k;
  }
}

TEST(Filters, TopPThenTopK) {
  // Three close logits and 100 zeros. top-p first (on the full distribution, mass of the three ≈ 0.17)
  // keeps many, top-k = 3 then keeps the three. The other order would renormalise the three to
  // 0.367, 0.332, 0.300 and top-p = 0.5 would drop the third.
  std::vector<float> logits(103, 0.0f);
  logits[10] = 2.0f;
  logits[50] = 1.9f;
  logits[90] = 1.8f;
  EXPECT_EQ(support(fused_probs(logits, 1.0f, 0.5f, 3)), (std::set<int>{10, 50, 90}));
  EXPECT_EQ(support(reference_probs(logits, 1.0f, 0.5f, 3)), (std::set<int>{10, 50, 90}));
  // When top-p keeps fewer than k, top-k changes nothing.
  const std::vector<float> small{3.0f, 2.0f, 1.0f, 0.0f};
  EXPECT_EQ(support(fused_probs(small, 1.0f, 0.5f, 3)), (std::set<int>{0}));
}

TEST(Confidence, MarginEntropyProbability) {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  FilterScratch scratch;
  Rng rng(0);
  const FilterConfig greedy{0.0f, 1.0f, 0};
  auto conf = [&](ConfidenceKind kind, FilterConfig cfg, std::vector<float> x) {
    Result<TokenSample> r = sample_token(x.data(), static_cast<int64_t>(x.size()), cfg, kind, rng, scratch);
    EXPECT_TRUE(r.ok());
    return *r;
  };
  TokenSample s = conf(ConfidenceKind::kProbability, greedy, logits);
  EXPECT_EQ(s.token, 0);
  EXPECT_NEAR(s.confidence, 0.5f, 1e-6);
  EXPECT_NEAR(conf(ConfidenceKind::kMargin, greedy, logits).confidence, 0.2f, 1e-6);
  const double h = 0.5 * std::log(0.5 + 1e-10) + 0.3 * std::log(0.3 + 1e-10) + 0.2 * std::log(0.2 + 1e-10);
  EXPECT_NEAR(conf(ConfidenceKind::kNegEntropy, greedy, logits).confidence, h, 1e-6);
  // Margin with a single survivor: top-2 is 0, margin 1. Entropy of a point mass: 1·log(1 + 1e-10) ≈ 0.
  EXPECT_NEAR(conf(ConfidenceKind::kMargin, {0.0f, 1.0f, 1}, logits).confidence, 1.0f, 1e-6);
  EXPECT_NEAR(conf(ConfidenceKind::kNegEntropy, {0.0f, 1.0f, 1}, logits).confidence, 0.0f, 1e-6);
  // Tied top two: margin 0.
  EXPECT_EQ(conf(ConfidenceKind::kMargin, greedy, {1.0f, 1.0f, 0.0f}).confidence, 0.0f);
  // Confidences are over the tempered, filtered distribution: T = 0.5 squares and renormalises.
  const double tempered[3] = {0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38};
  for (int i = 0; i < 20; ++i) {
    TokenSample ts = conf(ConfidenceKind::kProbability, {0.5f, 1.0f, 0}, logits);
    EXPECT_NEAR(ts.confidence, tempered[ts.token], 1e-6);
  }
  TokenSample filtered = conf(ConfidenceKind::kProbability, {0.0f, 1.0f, 2}, logits);
  EXPECT_NEAR(filtered.confidence, 0.5 / 0.8, 1e-6);
}

TEST(Greedy, ArgmaxTiesPickLowestId) {
  FilterScratch scratch;
  Rng rng(0);
  for (int64_t top_k : {0, 1, 2, 3}) {
    std::vector<float> x{1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    Result<TokenSample> r = sample_token(x.data(), 5, {0.0f, 1.0f, top_k}, ConfidenceKind::kProbability, rng, scratch);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->token, 1) << "top_k " << top_k;
  }
}

TEST(Sampling, FrequenciesAfterFilters) {
  const std::vector<float> logits{2.0f, 1.5f, 1.4f, 1.0f, 0.5f, 0.2f, -1.0f, 3.0f};
  const float t = 0.7f, top_p = 0.9f;
  const int64_t top_k = 5;
  const std::vector<double> want = reference_probs(logits, t, top_p, top_k);
  ASSERT_EQ(support(want).size(), 4u);  // top-p (not top-k) is the binding filter here
  std::vector<int64_t> counts(logits.size(), 0);
  FilterScratch scratch;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> x = logits;
    Rng rng = Rng::for_stream(11, RngPurpose::kTest, 0, i, 0);
    Result<TokenSample> r = sample_token(x.data(), 8, {t, top_p, top_k}, ConfidenceKind::kProbability, rng, scratch);
    ASSERT_TRUE(r.ok());
    ++counts[r->token];
    ASSERT_NEAR(r->confidence, want[r->token], 1e-6);
  }
  for (size_t v = 0; v < logits.size(); ++v) {
    if (want[v] == 0.0) {
      EXPECT_EQ(counts[v], 0) << "filtered token " << v << " was sampled";
    } else {
      const double sd = std::sqrt(n * want[v] * (1 - want[v]));
      EXPECT_LE(std::abs(counts[v] - n * want[v]), 5 * sd) << "token " << v << " count " << counts[v];
    }
  }
}

// The fused path on random rows (with and without ties, both selection strategies) against the dense
// double reference: same survivors, probabilities within 2e-6.
TEST(Filters, FusedMatchesDenseReference) {
  int trial = 0;
  for (int64_t n_vocab : {int64_t{7}, int64_t{300}, int64_t{5000}, int64_t{152064}}) {
    const bool big = n_vocab > 10000;  // the dense reference sorts the whole vocabulary: fewer cases
    const int reps = big ? 2 : 6;
    for (int rep = 0; rep < reps; ++rep) {
      std::vector<float> logits(static_cast<size_t>(n_vocab));
      const bool ties = rep % 2 == 1;
      for (int64_t i = 0; i < n_vocab; ++i) {
        float v = 6.0f * testing::hash_unit(n_vocab, rep, i);
        logits[i] = ties ? std::round(v * 2.0f) / 2.0f : v;
      }
      for (float t : {0.0f, 0.3f, 1.0f}) {
        for (float top_p : {1.0f, 0.95f, 0.5f}) {
          for (int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{50}, n_vocab}) {
            if (big && (top_k == 1 || top_k == 5 || t == 0.3f)) continue;
            ++trial;
            const std::vector<double> want = reference_probs(logits, t, top_p, top_k);
            const std::vector<double> got = fused_probs(logits, t, top_p, top_k);
            ASSERT_EQ(support(got), support(want)) << "V " << n_vocab << " rep " << rep << " T " << t << " top_p "
                                                   << top_p << " top_k " << top_k;
            for (size_t i = 0; i < want.size(); ++i) {
              ASSERT_NEAR(got[i], want[i], 2e-6) << "token " << i << " V " << n_vocab << " trial " << trial;
            }
          }
        }
      }
    }
  }
}

// The dense in-place steps give the same distribution as the fused path.
TEST(Filters, InPlaceStepsMatchFused) {
  const int64_t n_vocab = 2000;
  std::vector<float> logits(n_vocab);
  for (int64_t i = 0; i < n_vocab; ++i) logits[i] = 4.0f * testing::hash_unit(5, i);
  FilterScratch scratch;
  for (float top_p : {1.0f, 0.9f, 0.3f}) {
    for (int64_t top_k : {int64_t{0}, int64_t{3}, int64_t{40}}) {
      std::vector<float> x = logits;
      apply_temperature(x.data(), n_vocab, 0.8f);
      top_p_filter(x.data(), n_vocab, top_p, scratch);
      top_k_filter(x.data(), n_vocab, top_k, scratch);
      softmax_in_place(x.data(), n_vocab);
      const std::vector<double> fused = fused_probs(logits, 0.8f, top_p, top_k);
      for (int64_t i = 0; i < n_vocab; ++i) ASSERT_NEAR(x[i], fused[i], 1e-6) << "token " << i;
    }
  }
}

TEST(Filters, SoftmaxAccuracy) {
  // Values spanning the useful range of x − max, including -inf.
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) x.push_back(-0.02f * i);
  x.push_back(-kInf);
  std::vector<float> p = x;
  softmax_in_place(p.data(), static_cast<int64_t>(p.size()));
  double z = 0.0;
  for (float v : x) z += std::exp(static_cast<double>(v));
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i])) / z;
    ASSERT_NEAR(p[i], want, 4e-7 * want + 1e-37) << "i " << i;
  }
  EXPECT_EQ(p.back(), 0.0f);
}

TEST(Filters, NonFiniteLogitsRejected) {
  FilterScratch scratch;
  Rng rng(0);
  auto status = [&](std::vector<float> x, float t) {
    return sample_token(x.data(), static_cast<int64_t>(x.size()), {t, 1.0f, 0}, ConfidenceKind::kProbability, rng,
                        scratch)
        .status();
  };
  Status nan = status({0.0f, std::nanf(""), 1.0f}, 1.0f);
  EXPECT_FALSE(nan.ok());
  EXPECT_NE(nan.message().find("token 1"), std::string::npos) << nan.message();
  EXPECT_FALSE(status({0.0f, kInf}, 0.0f).ok());
  EXPECT_FALSE(status({-kInf, -kInf}, 1.0f).ok());
  Status overflow = status({100.0f, 0.0f}, 1e-38f);
  EXPECT_NE(overflow.message().find("temperature"), std::string::npos) << overflow.message();
  // −inf on some tokens (a hook banning them) is fine and never sampled.
  EXPECT_TRUE(status({-kInf, 0.0f, 1.0f}, 1.0f).ok());
}

TEST(Filters, FullVocabTiming) {
  const int64_t n_vocab = 152064;
  std::vector<float> logits(n_vocab);
  for (int64_t i = 0; i < n_vocab; ++i) logits[i] = 8.0f * testing::hash_unit(77, i);
  FilterScratch scratch;
  for (FilterConfig cfg : {FilterConfig{0.3f, 0.95f, 50}, FilterConfig{0.3f, 1.0f, 50}, FilterConfig{1.0f, 0.95f, 0},
                           FilterConfig{1.0f, 1.0f, 0}}) {
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      std::vector<float> x = logits;
      Rng rng(r);
      ASSERT_TRUE(sample_token(x.data(), n_vocab, cfg, ConfidenceKind::kNegEntropy, rng, scratch).ok());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("sample_token V=152064 T=%.1f top_p=%.2f top_k=%ld: %.3f ms/row\n", cfg.temperature, cfg.top_p,
                static_cast<long>(cfg.top_k), ms);
  }
}

}  // namespace
}  // namespace dc
