// The run-time CPU levels (core/cpu_level.cc, ops/cpu/cpu_features.cc) and the portable kernels' two
// variants (core/kernel_variant.h): DC_CPU_LEVEL's names, the cap, that the dispatch runs the capped level's variant,
// and each variant (baseline, and AVX2 + FMA where the CPU has it) through the op front-ends of a fast
// context (which fall back to them below AVX-512) against a double-precision reference (matmul, RMSNorm,
// SwiGLU, attention, cross-entropy; relative 1e-5) or against the other variant (the rest).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "core/cpu_level.h"
#include "core/dtype.h"
#include "kernel_test_util.h"
#include "ops/attention.h"
#include "ops/attention_window.h"
#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"

// Two of the variants, called directly (their definitions: kernels_avx2.cc and the portable .cc files).
namespace dc::cpu::baseline {
decltype(::dc::cpu::matmul_nt) matmul_nt;
decltype(::dc::cpu::attention) attention;
}  // namespace dc::cpu::baseline
namespace dc::cpu::avx2 {
decltype(::dc::cpu::matmul_nt) matmul_nt;
decltype(::dc::cpu::attention) attention;
}  // namespace dc::cpu::avx2

namespace dc {
namespace {

using dc::testing::expect_close;
using dc::testing::random_vec;

TEST(CpuLevel, ParsesItsNamesAndRefusesOthers) {
  for (CpuLevel level : {CpuLevel::kBaseline, CpuLevel::kAvx2, CpuLevel::kAvx512, CpuLevel::kAvx512Bf16,
                         CpuLevel::kAmx, CpuLevel::kNative}) {
    const auto parsed = parse_cpu_level(cpu_level_name(level));
    ASSERT_TRUE(parsed.ok()) << cpu_level_name(level);
    EXPECT_EQ(parsed.value(), level);
  }
  for (const char* bad : {"AVX2", "avx", "x86-64-v3", ""}) {
    const auto parsed = parse_cpu_level(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("DC_CPU_LEVEL"), std::string::npos) << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("baseline, avx2"), std::string::npos) << parsed.status().message();
  }
}

TEST(CpuLevel, TheCapLowersTheLevelAndEveryFeatureWithIt) {
  const char* env = std::getenv("DC_CPU_LEVEL");
  const CpuLevel detected = cpu_detected_level();
  const CpuLevel uncapped = cpu_level();  // the detected level, or DC_CPU_LEVEL's cap below it
  EXPECT_LE(uncapped, detected);
  if (env == nullptr || *env == '\0') {
    EXPECT_EQ(uncapped, detected);
    EXPECT_TRUE(check_cpu_level_env().ok());
  }
  set_cpu_level_cap_for_testing(CpuLevel::kBaseline);
  EXPECT_EQ(cpu_level(), CpuLevel::kBaseline);
  EXPECT_FALSE(cpu::cpu_has_avx2() || cpu::cpu_has_avx512() || cpu::cpu_has_avx512_bf16() || cpu::cpu_has_amx_bf16());
  set_cpu_level_cap_for_testing(CpuLevel::kAvx2);
  EXPECT_EQ(cpu_level(), std::min(uncapped, CpuLevel::kAvx2));
  EXPECT_EQ(cpu::cpu_has_avx2(), uncapped >= CpuLevel::kAvx2);
  EXPECT_FALSE(cpu::cpu_has_avx512());
  set_cpu_level_cap_for_testing(CpuLevel::kNative);
  EXPECT_EQ(cpu_level(), uncapped);
  EXPECT_EQ(cpu::cpu_has_avx512_bf16(), uncapped >= CpuLevel::kAvx512Bf16);
  cpu::force_portable_kernels_for_testing(true);  // its meaning since before the levels: no AVX-512
  EXPECT_FALSE(cpu::cpu_has_avx512());
  EXPECT_EQ(cpu_level(), std::min(uncapped, CpuLevel::kAvx2));
  cpu::force_portable_kernels_for_testing(false);
  EXPECT_EQ(cpu_level(), uncapped);
}

// matmul_nt with every weight row converted as the kernels convert it, summed in double.
std::vector<float> matmul_double(const std::vector<float>& x, int64_t n, const WeightView& w) {
  std::vector<float> y(n * w.rows), row(w.cols);
  for (int64_t j = 0; j < w.rows; ++j) {
    w.row_to_f32(j, row.data());
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t t = 0; t < w.cols; ++t) s += static_cast<double>(x[i * w.cols + t]) * row[t];
      y[i * w.rows + j] = static_cast<float>(s);
    }
  }
  return y;
}

std::vector<float> attention_double(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const uint8_t* valid) {
  const int64_t B = s.n_batch, L = s.n_seq, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  std::vector<float> out(B * L * H * D, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        if (!valid[b * L + i]) continue;
        const int64_t hk = h / (H / Hkv);
        const float* qi = q.data() + ((b * L + i) * H + h) * D;
        std::vector<double> p(L, 0.0);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < L; ++j) {
          if (!valid[b * L + j]) continue;
          double dot = 0;
          for (int64_t t = 0; t < D; ++t) dot += static_cast<double>(qi[t]) * k[((b * L + j) * Hkv + hk) * D + t];
          p[j] = dot / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j < L; ++j)
          if (valid[b * L + j]) sum += p[j] = std::exp(p[j] - mx);
        for (int64_t t = 0; t < D; ++t) {
          double o = 0;
          for (int64_t j = 0; j < L; ++j)
            if (valid[b * L + j]) o += p[j] / sum * v[((b * L + j) * Hkv + hk) * D + t];
          out[((b * L + i) * H + h) * D + t] = static_cast<float>(o);
        }
      }
  return out;
}

// Runs each test with the level capped at GetParam(): the portable kernels' baseline or AVX2 variant.
class PortableVariantTest : public ::testing::TestWithParam<CpuLevel> {
 protected:
  PortableVariantTest() : pool_(3) { ctx_.pool = &pool_; }
  void SetUp() override {
    if (cpu_level() < GetParam())  // the CPU's level, or DC_CPU_LEVEL's cap
      GTEST_SKIP() << "no " << cpu_level_name(GetParam()) << " (level " << cpu_level_name(cpu_level()) << ")";
    set_cpu_level_cap_for_testing(GetParam());
    ASSERT_EQ(cpu_level(), GetParam());
  }
  void TearDown() override { set_cpu_level_cap_for_testing(CpuLevel::kNative); }
  bool avx2() const { return GetParam() == CpuLevel::kAvx2; }

  ThreadPool pool_;
  Context ctx_;  // the fast kernels (the default), which fall back to the portable ones below AVX-512
};

TEST_P(PortableVariantTest, DispatchRunsTheVariantOfTheLevel) {
  const int64_t n = 6, m = 21, k = 130;
  const auto x = random_vec(n * k, 1), wf = random_vec(m * k, 2);
  const WeightView w{DType::kF32, wf.data(), m, k};
  std::vector<float> got(n * m), want(n * m);
  matmul_nt(ctx_, x.data(), n, w, nullptr, got.data());
  (avx2() ? cpu::avx2::matmul_nt : cpu::baseline::matmul_nt)(&pool_, x.data(), n, w, nullptr, want.data(), false);
  EXPECT_EQ(got, want);
  const AttentionShape s{1, 9, 2, 1, 20};
  const auto q = random_vec(9 * 2 * 20, 3), kv = random_vec(9 * 20, 4);
  std::vector<float> att(q.size()), att_want(q.size());
  attention(ctx_, s, q.data(), kv.data(), kv.data(), nullptr, att.data());
  (avx2() ? cpu::avx2::attention : cpu::baseline::attention)(&pool_, s, q.data(), kv.data(), kv.data(), nullptr,
                                                             att_want.data());
  EXPECT_EQ(att, att_want);
}

TEST_P(PortableVariantTest, MatmulAgainstDouble) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16})
    for (auto [n, m, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 33, 100}, {7, 9, 1030}, {4, 64, 64}}) {
      const auto x = random_vec(n * k, static_cast<uint32_t>(n + k)), wf = random_vec(m * k, static_cast<uint32_t>(m));
      std::vector<uint16_t> half(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) half[i] = dtype == DType::kBF16 ? f32_to_bf16(wf[i]) : f32_to_f16(wf[i]);
      const WeightView w{dtype, dtype == DType::kF32 ? static_cast<const void*>(wf.data()) : half.data(), m, k};
      std::vector<float> y(n * m);
      matmul_nt(ctx_, x.data(), n, w, nullptr, y.data());
      expect_close(matmul_double(x, n, w), y, 1e-5,
                   std::string("matmul ") + dtype_name(dtype) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
    }
}

TEST_P(PortableVariantTest, NormSwigluAndAddAgainstDouble) {
  const int64_t n = 7, d = 899;
  const auto x = random_vec(n * d, 5), g = random_vec(n * d, 6), w = random_vec(d, 7);
  std::vector<float> y(n * d), want(n * d);
  rms_norm(ctx_, x.data(), w.data(), n, d, 1e-6f, y.data());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t t = 0; t < d; ++t) ss += static_cast<double>(x[i * d + t]) * x[i * d + t];
    const double r = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t t = 0; t < d; ++t) want[i * d + t] = static_cast<float>(x[i * d + t] * r * w[t]);
  }
  expect_close(want, y, 1e-5, "rms_norm");
  swiglu(ctx_, g.data(), x.data(), n * d, y.data());
  for (int64_t i = 0; i < n * d; ++i) want[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * x[i]);
  expect_close(want, y, 1e-5, "swiglu");
  y = x;
  add_inplace(ctx_, y.data(), g.data(), n * d);
  for (int64_t i = 0; i < n * d; ++i) want[i] = x[i] + g[i];
  EXPECT_EQ(y, want) << "add_inplace";
}

TEST_P(PortableVariantTest, AttentionAgainstDouble) {
  const AttentionShape s{2, 13, 4, 2, 35};
  const auto q = random_vec(2 * 13 * 4 * 35, 8), k = random_vec(2 * 13 * 2 * 35, 9), v = random_vec(2 * 13 * 2 * 35, 10);
  std::vector<uint8_t> valid(2 * 13, 1);
  for (int i = 0; i < 4; ++i) valid[13 + i] = 0;  // row 1 left-padded
  std::vector<float> out(q.size(), NAN);
  attention(ctx_, s, q.data(), k.data(), v.data(), valid.data(), out.data());
  const auto want = attention_double(s, q, k, v, valid.data());
  expect_close(want, out, 1e-5, "attention");
  std::vector<float> window(2 * 5 * 4 * 35, NAN);  // queries 6..10 of both rows
  std::vector<float> qw(window.size());
  for (int64_t b = 0; b < 2; ++b)
    std::copy_n(q.begin() + (b * 13 + 6) * 4 * 35, 5 * 4 * 35, qw.begin() + b * 5 * 4 * 35);
  attention_window(ctx_, s, 6, 5, qw.data(), k.data(), v.data(), valid.data(), window.data());
  std::vector<float> want_window(window.size());
  for (int64_t b = 0; b < 2; ++b)
    std::copy_n(want.begin() + (b * 13 + 6) * 4 * 35, 5 * 4 * 35, want_window.begin() + b * 5 * 4 * 35);
  expect_close(want_window, window, 1e-5, "attention_window");
}

TEST_P(PortableVariantTest, CrossEntropyAgainstDouble) {
  const int64_t n = 5, n_vocab = 1001;
  const auto logits = random_vec(n * n_vocab, 11, 3.0f);
  const std::vector<int32_t> targets = {0, 17, 1000, 500, 3};
  const std::vector<float> weights = {1.0f, 0.5f, 2.0f, 1.0f, 0.0f};
  std::vector<float> dlogits(logits.size()), want_d(logits.size());
  const double loss = cross_entropy(ctx_, logits.data(), targets.data(), weights.data(), n, n_vocab, dlogits.data());
  double want_loss = 0;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits.data() + r * n_vocab;
    const double mx = *std::max_element(x, x + n_vocab);
    double sum = 0;
    for (int64_t c = 0; c < n_vocab; ++c) sum += std::exp(x[c] - mx);
    const double lse = mx + std::log(sum);
    want_loss += weights[r] * (lse - x[targets[r]]);
    for (int64_t c = 0; c < n_vocab; ++c)
      want_d[r * n_vocab + c] = static_cast<float>(weights[r] * (std::exp(x[c] - lse) - (c == targets[r] ? 1 : 0)));
  }
  EXPECT_NEAR(loss, want_loss, 1e-5 * std::abs(want_loss));
  expect_close(want_d, dlogits, 1e-5, "cross_entropy dlogits");
}

// The kernels without a double reference here (tests/ops/backward_test.cc checks their math): the level's
// variant against the baseline variant, within the f32 summation-order tolerance (equal at the baseline).
TEST_P(PortableVariantTest, BackwardAndRopeAgreeWithTheBaselineVariant) {
  const int64_t n = 9, d = 70, heads = 2, head_dim = 35;
  const AttentionShape s{1, n, heads, 1, head_dim};
  const auto x = random_vec(n * d, 12), dy = random_vec(n * d, 13), w = random_vec(d, 14), g = random_vec(n * d, 15);
  const auto kv = random_vec(n * head_dim, 16), dout = random_vec(n * d, 17);
  std::vector<float> cos(n * 17), sin(n * 17);
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i * 3);
  rope_tables(pos.data(), n, 34, 10000.0, cos.data(), sin.data());
  auto run = [&] {
    std::vector<float> dx(n * d, 0.0f), dw(d, 0.0f), dgate(n * d), dup(n * d), rope(x.begin(), x.begin() + n * 68);
    std::vector<float> att(n * d), dq(n * d, 0.0f), dk(n * head_dim, 0.0f), dv(n * head_dim, 0.0f);
    rms_norm_backward(ctx_, x.data(), w.data(), dy.data(), n, d, 1e-6f, dx.data(), dw.data());
    swiglu_backward(ctx_, g.data(), x.data(), dy.data(), n * d, dgate.data(), dup.data());
    rope_apply(ctx_, rope.data(), n, 2, 34, cos.data(), sin.data());
    attention(ctx_, s, x.data(), kv.data(), kv.data(), nullptr, att.data());
    attention_backward(ctx_, s, x.data(), kv.data(), kv.data(), nullptr, att.data(), dout.data(), dq.data(), dk.data(),
                       dv.data());
    return std::vector<std::vector<float>>{dx, dw, dgate, dup, rope, dq, dk, dv};
  };
  const auto got = run();
  set_cpu_level_cap_for_testing(CpuLevel::kBaseline);
  const auto want = run();
  for (size_t i = 0; i < got.size(); ++i) {
    if (avx2()) {
      expect_close(want[i], got[i], 1e-5, "output " + std::to_string(i));
    } else {
      EXPECT_EQ(want[i], got[i]) << "output " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, PortableVariantTest, ::testing::Values(CpuLevel::kBaseline, CpuLevel::kAvx2),
                         [](const auto& info) { return std::string(cpu_level_name(info.param)); });

}  // namespace
}  // namespace dc
