// Each CPU op against a plain double-precision reference on random inputs, with and without threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "kernel_test_util.h"
#include "ops/matmul.h"

namespace dc {
namespace {

using dc::testing::random_vec;

void expect_close_to_ref(const std::vector<double>& want, const float* got, double rel_tol, const char* what) {
  double max_ref = 1e-30;
  for (double w : want) max_ref = std::max(max_ref, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel_tol * max_ref) << what << " index " << i << " tol " << rel_tol * max_ref;
}

struct WeightHolder {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightView view;
  std::vector<double> as_double;  // the values the kernel must see (after rounding to the dtype)
};

WeightHolder make_weight(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  WeightHolder h;
  h.f32 = random_vec(rows * cols, seed, 0.5f);
  h.as_double.resize(h.f32.size());
  if (dtype == DType::kF32) {
    for (size_t i = 0; i < h.f32.size(); ++i) h.as_double[i] = h.f32[i];
    h.view = {dtype, h.f32.data(), rows, cols};
  } else {
    h.half.resize(h.f32.size());
    for (size_t i = 0; i < h.f32.size(); ++i) {
      h.half[i] = dtype == DType::kBF16 ? f32_to_bf16(h.f32[i]) : f32_to_f16(h.f32[i]);
      h.as_double[i] = dtype == DType::kBF16 ? bf16_to_f32(h.half[i]) : f16_to_f32(h.half[i]);
    }
    h.view = {dtype, h.half.data(), rows, cols};
  }
  return h;
}

class OpsTest : public ::testing::TestWithParam<int> {
 protected:
  OpsTest() : pool_(GetParam()) { ctx_.pool = &pool_; }
  ThreadPool pool_;
  Context ctx_;
};

TEST_P(OpsTest, MatmulNtAllDtypesAndTails) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [n, m, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {8, 64, 33}, {13, 70, 128}}) {
      WeightHolder w = make_weight(dtype, m, k, 7 + n + m);
      auto x = random_vec(n * k, 11 + k);
      auto bias = random_vec(m, 5);
      std::vector<float> y(n * m, NAN);
      matmul_nt(ctx_, x.data(), n, w.view, bias.data(), y.data());
      std::vector<double> want(n * m);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
          double acc = bias[j];
          for (int64_t t = 0; t < k; ++t) acc += static_cast<double>(x[i * k + t]) * w.as_double[j * k + t];
          want[i * m + j] = acc;
        }
      expect_close_to_ref(want, y.data(), 1e-5, dtype_name(dtype));
    }
  }
}

TEST_P(OpsTest, RmsNorm) {
  const int64_t n = 5, d = 37;
  auto x = random_vec(n * d, 1, 3.0f), w = random_vec(d, 2);
  std::vector<float> y(n * d);
  rms_norm(ctx_, x.data(), w.data(), n, d, 1e-6f, y.data());
  std::vector<double> want(n * d);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t t = 0; t < d; ++t) ss += double(x[i * d + t]) * x[i * d + t];
    const double r = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t t = 0; t < d; ++t) want[i * d + t] = x[i * d + t] * r * w[t];
  }
  expect_close_to_ref(want, y.data(), 1e-6, "rms_norm");
}

TEST_P(OpsTest, RopeRotateHalf) {
  const int64_t n = 6, heads = 3, D = 16;
  const double theta = 1e6;
  std::vector<int32_t> pos = {0, 1, 2, 7, 100, 4095};
  auto x = random_vec(n * heads * D, 3);
  std::vector<float> cos(n * D / 2), sin(n * D / 2), y = x;
  rope_tables(pos.data(), n, D, theta, cos.data(), sin.data());
  rope_apply(ctx_, y.data(), n, heads, D, cos.data(), sin.data());
  std::vector<double> want(x.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < D / 2; ++t) {
        // The spec computes inv_freq and the angle in f32; only cos/sin and the products are in double.
        const float inv = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * t) / D);
        const double ang = static_cast<float>(pos[i]) * inv;
        const float* v = x.data() + (i * heads + h) * D;
        want[(i * heads + h) * D + t] = v[t] * std::cos(ang) - v[t + D / 2] * std::sin(ang);
        want[(i * heads + h) * D + t + D / 2] = v[t + D / 2] * std::cos(ang) + v[t] * std::sin(ang);
      }
  expect_close_to_ref(want, y.data(), 1e-6, "rope");
}

TEST_P(OpsTest, SwigluAndAdd) {
  const int64_t n = 1000;
  auto g = random_vec(n, 4, 4.0f), u = random_vec(n, 5), y = random_vec(n, 6);
  std::vector<float> out(n), y0 = y;
  swiglu(ctx_, g.data(), u.data(), n, out.data());
  add_inplace(ctx_, y.data(), out.data(), n);
  std::vector<double> want_s(n), want_y(n);
  for (int64_t i = 0; i < n; ++i) {
    want_s[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    want_y[i] = y0[i] + double(out[i]);
  }
  expect_close_to_ref(want_s, out.data(), 1e-6, "swiglu");
  expect_close_to_ref(want_y, y.data(), 1e-6, "add");
}

TEST_P(OpsTest, EmbeddingBf16) {
  WeightHolder table = make_weight(DType::kBF16, 10, 8, 9);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  std::vector<float> out(ids.size() * 8);
  embedding(ctx_, table.view, ids.data(), ids.size(), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int t = 0; t < 8; ++t) ASSERT_EQ(out[i * 8 + t], table.as_double[ids[i] * 8 + t]) << i << "," << t;
}

TEST_P(OpsTest, AttentionGqaWithPaddingMask) {
  const AttentionShape s{2, 7, 6, 2, 8};
  const int64_t qd = s.n_head * s.head_dim, kd = s.n_head_kv * s.head_dim;
  auto q = random_vec(s.n_batch * s.n_seq * qd, 1), k = random_vec(s.n_batch * s.n_seq * kd, 2),
       v = random_vec(s.n_batch * s.n_seq * kd, 3);
  // Row 0 has two left pads, row 1 none.
  std::vector<uint8_t> valid = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (const uint8_t* mask : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(valid.data())}) {
    std::vector<float> out(q.size(), NAN);
    attention(ctx_, s, q.data(), k.data(), v.data(), mask, out.data());
    std::vector<double> want(q.size(), 0.0);
    for (int64_t b = 0; b < s.n_batch; ++b)
      for (int64_t h = 0; h < s.n_head; ++h)
        for (int64_t i = 0; i < s.n_seq; ++i) {
          auto ok = [&](int64_t j) { return mask == nullptr || mask[b * s.n_seq + j]; };
          if (!ok(i)) continue;  // a query with no key: zero output
          const int64_t hk = h / (s.n_head / s.n_head_kv);
          std::vector<double> sc(s.n_seq, -INFINITY);
          double mx = -INFINITY;
          for (int64_t j = 0; j < s.n_seq; ++j) {
            if (!ok(j)) continue;
            double d = 0;
            for (int64_t t = 0; t < s.head_dim; ++t)
              d += double(q[(b * s.n_seq + i) * qd + h * s.head_dim + t]) * k[(b * s.n_seq + j) * kd + hk * s.head_dim + t];
            sc[j] = d / std::sqrt(double(s.head_dim));
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (int64_t j = 0; j < s.n_seq; ++j) sum += ok(j) ? std::exp(sc[j] - mx) : 0.0;
          for (int64_t j = 0; j < s.n_seq; ++j) {
            if (!ok(j)) continue;
            const double p = std::exp(sc[j] - mx) / sum;
            for (int64_t t = 0; t < s.head_dim; ++t)
              want[(b * s.n_seq + i) * qd + h * s.head_dim + t] += p * v[(b * s.n_seq + j) * kd + hk * s.head_dim + t];
          }
        }
    expect_close_to_ref(want, out.data(), 1e-5, mask ? "attention(masked)" : "attention");
  }
}

// Hashed dropout: its integer threshold keeps exactly the values the defining comparison (h >> 11)·2⁻⁵³ >= p
// keeps (hashes drawn at random and at the threshold's edges, p tiny to near 1), and the op writes x / (1 − p)
// where its mask keeps and 0 elsewhere, the same with any thread count.
TEST_P(OpsTest, DropoutKeepsWhatTheDefiningComparisonKeeps) {
  uint64_t state = 3;
  for (const float p : {1e-9f, 0.1f, 0.3333333f, 0.5f, 0.9999f}) {
    const uint64_t t = dropout_threshold(p);
    for (int i = 0; i < 4000; ++i) {
      const uint64_t r = splitmix64_next(state);
      const uint64_t h = i < 2000 ? r : t + (r % 8192) - 4096;  // near the threshold
      const bool keeps = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) >= static_cast<double>(p);
      ASSERT_EQ(h >= t, keeps) << "p " << p << " h " << h;
    }
  }
  EXPECT_EQ(dropout_threshold(0.0f), 0u);
  const int64_t n = 19, d = 23;
  const float p = 0.25f;
  const std::vector<float> x = random_vec(n * d, 7);
  std::vector<float> y(n * d, NAN);
  dropout_hashed(ctx_, x.data(), n, d, 77, p, y.data());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < d; ++c) {
      const bool keep = dropout_keeps(77, i, c, dropout_threshold(p));
      kept += keep;
      ASSERT_EQ(y[i * d + c], keep ? x[i * d + c] * (1.0f / (1.0f - p)) : 0.0f) << "row " << i << " col " << c;
    }
  EXPECT_GT(kept, n * d / 2) << "a mask that keeps too little";
  EXPECT_LT(kept, n * d) << "a mask that keeps everything";
}

INSTANTIATE_TEST_SUITE_P(Threads, OpsTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace dc
