// The fused AdamW + bf16 re-layout (ops/adamw.h) against its reference: adamw_value value by value, then
// the updated weights rounded to bf16 and laid out by pack_panels, as MixedPrecisionWeights::refresh does.
// Everything must agree bit for bit.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/adamw.h"
#include "ops/matmul.h"

namespace dc {
namespace {

// A 64-byte-aligned block of `bytes` filled with `fill` (the fused kernel must overwrite all of it).
struct Aligned {
  explicit Aligned(int64_t bytes, uint8_t fill) : storage(static_cast<size_t>(bytes) + 64, fill) {
    data = reinterpret_cast<uint32_t*>(storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64);
  }
  std::vector<uint8_t> storage;
  uint32_t* data;
};

class AdamWPanelsTest : public ::testing::TestWithParam<int> {};  // param: threads (1 = no pool)

TEST_P(AdamWPanelsTest, MatchesUpdateThenPack) {
  std::unique_ptr<ThreadPool> pool = GetParam() > 1 ? std::make_unique<ThreadPool>(GetParam()) : nullptr;
  Context ctx;
  ctx.pool = pool.get();
  ctx.matmul_precision = MatmulPrecision::kBF16;
  if (!bf16_backward(ctx)) GTEST_SKIP() << "no AVX512_BF16";
  // Whole panels, odd sizes, fewer rows than a strip, a column count that is not a multiple of 32.
  for (const auto [rows, cols] : {std::array<int64_t, 2>{64, 64}, {100, 37}, {17, 130}, {1, 1}, {130, 257},
                                  {3, 5}, {128, 896}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const int64_t n = rows * cols;
    std::mt19937 gen(static_cast<uint32_t>(n));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> p(n), g(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = 0.05f * dist(gen), g[i] = dist(gen), m[i] = 0.1f * dist(gen), v[i] = 0.01f * std::fabs(dist(gen));
    }
    const AdamWStep s = adamw_scalars(3, 1e-3, 0.9, 0.999, 1e-8, 0.1, 0.7f);
    // Reference: the update, then the copies as refresh makes them.
    std::vector<float> rp = p, rm = m, rv = v;
    for (int64_t i = 0; i < n; ++i) adamw_value(s, rp[i], g[i], rm[i], rv[i]);
    std::vector<uint16_t> rounded(n);
    for (int64_t i = 0; i < n; ++i) rounded[i] = f32_to_bf16(rp[i]);
    const WeightView w_rm{DType::kBF16, rounded.data(), rows, cols};
    const int64_t w_bytes = panel_sizes(w_rm).data_bytes;
    Aligned want_w(w_bytes, 0);
    pack_panels(ctx, w_rm, want_w.data, nullptr, nullptr, 0, panel_sizes(w_rm).panels);

    Aligned got_w(w_bytes, 0xab);  // garbage: the padding must be written too
    adamw_update_panels(ctx, s, p.data(), g.data(), m.data(), v.data(), rows, cols, got_w.data);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&p[i], &rp[i], 4), 0) << "p[" << i << "] " << p[i] << " vs " << rp[i];
      ASSERT_EQ(std::memcmp(&m[i], &rm[i], 4), 0) << "m[" << i << "] " << m[i] << " vs " << rm[i];
      ASSERT_EQ(std::memcmp(&v[i], &rv[i], 4), 0) << "v[" << i << "] " << v[i] << " vs " << rv[i];
    }
    // The words of the layout (ops/weight.h); data_bytes may round up past them.
    const int64_t w_words = (rows + kPanelRows - 1) / kPanelRows * ((cols + 1) / 2) * kPanelRows;
    ASSERT_LE(w_words * 4, w_bytes);
    for (int64_t i = 0; i < w_words; ++i) ASSERT_EQ(got_w.data[i], want_w.data[i]) << "W panel word " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, AdamWPanelsTest, ::testing::Values(1, 3));

// The flat-buffer front-ends on the CPU (a device's reference): squared_norm and sum_floats are the double sums
// rounded (into the index asked for), and adamw_update with a clip sum is adamw_value at clip_grad_norm's
// coefficient max_norm / (√Σ + 1e-6) when max_norm > 0 and it is below 1 (else 1), bit for bit, whatever the
// thread count; a non-finite sum writes nothing (the optimizer's skip).
TEST(AdamWFlat, ClipsFromTheSumOfSquaresAsClipGradNormDoes) {
  ThreadPool pool(3);
  Context ctx;
  ctx.pool = &pool;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t n = 10007;
  std::vector<float> g(n), p0(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) g[i] = u(rng) * 0.01f, p0[i] = u(rng), m0[i] = u(rng) * 1e-3f, v0[i] = std::abs(u(rng)) * 1e-6f;
  double sum = 0;
  for (float x : g) sum += static_cast<double>(x) * x;
  std::vector<float> sums(3, -1.0f);
  squared_norm(ctx, g.data(), n, sums.data(), 2);
  EXPECT_EQ(sums[2], static_cast<float>(sum));
  EXPECT_EQ(sums[0], -1.0f) << "squared_norm wrote outside out[out_index]";
  float sumsq = 0;
  sum_floats(ctx, sums.data() + 1, 2, &sumsq);  // −1 + Σ
  EXPECT_EQ(sumsq, static_cast<float>(static_cast<double>(sums[2]) - 1.0));
  squared_norm(ctx, g.data(), n, &sumsq);
  for (const float max_norm : {0.1f, 100.0f, 0.0f}) {  // the norm is ~0.58: clipped, then not, then no clipping
    const double coef = max_norm / (std::sqrt(static_cast<double>(sumsq)) + 1e-6);
    const float want_scale = max_norm > 0 && coef < 1 ? static_cast<float>(coef) : 1.0f;
    const AdamWStep want_step = adamw_scalars(2, 1e-3, 0.9, 0.999, 1e-8, 0.01, want_scale);
    std::vector<float> p = p0, m = m0, v = v0, wp = p0, wm = m0, wv = v0;
    for (int64_t i = 0; i < n; ++i) adamw_value(want_step, wp[i], g[i], wm[i], wv[i]);
    adamw_update(ctx, adamw_scalars(2, 1e-3, 0.9, 0.999, 1e-8, 0.01, /*grad_scale, unused*/ 5.0f), p.data(), g.data(), m.data(), v.data(), n,
                 &sumsq, max_norm);
    EXPECT_EQ(p, wp) << "max_norm " << max_norm;
    EXPECT_EQ(m, wm) << "max_norm " << max_norm;
    EXPECT_EQ(v, wv) << "max_norm " << max_norm;
  }
  for (const float bad : {NAN, INFINITY}) {
    std::vector<float> p = p0, m = m0, v = v0;
    adamw_update(ctx, adamw_scalars(2, 1e-3, 0.9, 0.999, 1e-8, 0.01), p.data(), g.data(), m.data(), v.data(), n, &bad, 1.0f);
    EXPECT_TRUE(p == p0 && m == m0 && v == v0) << "a step with Σ g² = " << bad << " was applied";
  }
}

}  // namespace
}  // namespace dc
