// Every backward op against central differences of a double-precision reference of its forward:
// for L = Σ c·y (random c), the op's gradients must match dL/dinput computed numerically.
#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"

namespace dc {
namespace {

using Vec = std::vector<double>;

Vec random_doubles(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(dist(gen));  // values exactly representable in f32
  return v;
}
std::vector<float> to_f32(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f at x, step h.
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = f(x);
    x[i] = x0 - h;
    const double down = f(x);
    x[i] = x0;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

void expect_grad(const Vec& want, const float* got, double rel_tol, const char* what) {
  double max_ref = 1e-30;
  for (double w : want) max_ref = std::max(max_ref, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel_tol * max_ref) << what << " index " << i << " tol " << rel_tol * max_ref;
}

class BackwardTest : public ::testing::TestWithParam<int> {  // param: threads (1 = no pool)
 protected:
  void SetUp() override {
    if (GetParam() > 1) pool_ = std::make_unique<ThreadPool>(GetParam());
    ctx_.pool = pool_.get();
  }
  std::unique_ptr<ThreadPool> pool_;
  Context ctx_;
};

Vec rms_ref(const Vec& x, const Vec& w, int64_t n, int64_t d, double eps) {
  Vec y(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t t = 0; t < d; ++t) ss += x[i * d + t] * x[i * d + t];
    const double r = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t t = 0; t < d; ++t) y[i * d + t] = x[i * d + t] * r * w[t];
  }
  return y;
}

TEST_P(BackwardTest, RmsNorm) {
  const int64_t n = 5, d = 24;
  const double eps = 1e-6;
  const Vec x = random_doubles(n * d, 1), w = random_doubles(d, 2), c = random_doubles(n * d, 3);
  const Vec want_dx = numeric_grad([&](const Vec& xx) { return dot(c, rms_ref(xx, w, n, d, eps)); }, x);
  const Vec want_dw = numeric_grad([&](const Vec& ww) { return dot(c, rms_ref(x, ww, n, d, eps)); }, w);
  std::vector<float> dx(n * d, 0.5f), dw(d, 0.25f);  // backward adds: start from non-zero buffers
  rms_norm_backward(ctx_, to_f32(x).data(), to_f32(w).data(), to_f32(c).data(), n, d, static_cast<float>(eps),
                    dx.data(), dw.data());
  for (auto& v : dx) v -= 0.5f;
  for (auto& v : dw) v -= 0.25f;
  expect_grad(want_dx, dx.data(), 1e-5, "dx");
  expect_grad(want_dw, dw.data(), 1e-5, "dw");
}

TEST_P(BackwardTest, Rope) {
  const int64_t n = 4, heads = 3, hd = 8;
  std::vector<int32_t> pos = {0, 5, 1, 17};
  std::vector<float> cos(n * hd / 2), sin(n * hd / 2);
  rope_tables(pos.data(), n, hd, 10000.0, cos.data(), sin.data());
  const Vec x = random_doubles(n * heads * hd, 4), c = random_doubles(x.size(), 5);
  auto f = [&](const Vec& xx) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < hd / 2; ++t) {
          const int64_t o = (i * heads + h) * hd;
          const double x1 = xx[o + t], x2 = xx[o + t + hd / 2], co = cos[i * hd / 2 + t], si = sin[i * hd / 2 + t];
          s += c[o + t] * (x1 * co - x2 * si) + c[o + t + hd / 2] * (x2 * co + x1 * si);
        }
    return s;
  };
  const Vec want = numeric_grad(f, x);
  std::vector<float> g = to_f32(c);
  rope_backward(ctx_, g.data(), n, heads, hd, cos.data(), sin.data());
  expect_grad(want, g.data(), 1e-5, "dx");
}

TEST_P(BackwardTest, SwiGlu) {
  const int64_t n = 64;
  const Vec g = random_doubles(n, 6, 2.0), u = random_doubles(n, 7), c = random_doubles(n, 8);
  auto f = [&](const Vec& gg, const Vec& uu) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += c[i] * gg[i] / (1 + std::exp(-gg[i])) * uu[i];
    return s;
  };
  const Vec want_dg = numeric_grad([&](const Vec& gg) { return f(gg, u); }, g);
  const Vec want_du = numeric_grad([&](const Vec& uu) { return f(g, uu); }, u);
  std::vector<float> dg(n), du(n);
  swiglu_backward(ctx_, to_f32(g).data(), to_f32(u).data(), to_f32(c).data(), n, dg.data(), du.data());
  expect_grad(want_dg, dg.data(), 1e-5, "dgate");
  expect_grad(want_du, du.data(), 1e-5, "dup");
}

TEST_P(BackwardTest, Embedding) {
  const int64_t rows = 7, cols = 5;
  const std::vector<int32_t> ids = {3, 0, 3, 6, 3};  // repeated ids accumulate
  const Vec table = random_doubles(rows * cols, 9), c = random_doubles(ids.size() * cols, 10);
  auto f = [&](const Vec& t) {
    double s = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t k = 0; k < cols; ++k) s += c[i * cols + k] * t[ids[i] * cols + k];
    return s;
  };
  const Vec want = numeric_grad(f, table);
  std::vector<float> dt(rows * cols, 0.0f);
  embedding_backward(ctx_, ids.data(), static_cast<int64_t>(ids.size()), to_f32(c).data(), cols, dt.data());
  expect_grad(want, dt.data(), 1e-6, "dtable");
}

TEST_P(BackwardTest, MatmulNt) {
  const int64_t n = 6, in = 40, out = 9;
  const Vec x = random_doubles(n * in, 11), w = random_doubles(out * in, 12, 0.5), b = random_doubles(out, 13),
            c = random_doubles(n * out, 14);
  auto f = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double y = bb[o];
        for (int64_t k = 0; k < in; ++k) y += xx[i * in + k] * ww[o * in + k];
        s += c[i * out + o] * y;
      }
    return s;
  };
  const Vec want_dx = numeric_grad([&](const Vec& v) { return f(v, w, b); }, x);
  const Vec want_dw = numeric_grad([&](const Vec& v) { return f(x, v, b); }, w);
  const Vec want_db = numeric_grad([&](const Vec& v) { return f(x, w, v); }, b);
  const std::vector<float> wf = to_f32(w);
  for (bool reference : {false, true}) {
    Context ctx = ctx_;
    ctx.reference_kernels = reference;
    std::vector<float> dx(n * in, 0.0f), dw(out * in, 0.0f), db(out, 0.0f);
    matmul_nt_backward(ctx, to_f32(x).data(), n, WeightView{DType::kF32, wf.data(), out, in}, to_f32(c).data(),
                       dx.data(), dw.data(), db.data());
    expect_grad(want_dx, dx.data(), 1e-5, "dx");
    expect_grad(want_dw, dw.data(), 1e-5, "dw");
    expect_grad(want_db, db.data(), 1e-5, "db");
  }
}

// Mixed precision: dx = dy·w and dw = dyᵀ·x on bf16 operands with f32 sums, against a double reference
// over the same bf16-rounded operands (only the summation differs), with wᵀ laid out by the caller
// (kPanels, or w's kPanels viewed as kPanelsTransposed) or made per call; and transpose_to_bf16 exact.
TEST_P(BackwardTest, MatmulNtBf16) {
  Context ctx = ctx_;
  ctx.matmul_precision = MatmulPrecision::kBF16;
  if (!bf16_backward(ctx)) GTEST_SKIP() << "no AVX512_BF16";
  for (const auto [n, in, out] : {std::array<int64_t, 3>{6, 40, 9}, {33, 130, 67}, {1, 7, 3}}) {
    SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(in) + "x" + std::to_string(out));
    const Vec x = random_doubles(n * in, 21), w = random_doubles(out * in, 22, 0.5), dy = random_doubles(n * out, 23);
    auto round = [](const Vec& v) {
      Vec r(v.size());
      for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(static_cast<float>(v[i])));
      return r;
    };
    const Vec xb = round(x), wb = round(w), dyb = round(dy);
    Vec want_dx(n * in, 0.0), want_dw(out * in, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t k = 0; k < in; ++k) {
          want_dx[i * in + k] += dyb[i * out + o] * wb[o * in + k];
          want_dw[o * in + k] += dyb[i * out + o] * xb[i * in + k];
        }
    const std::vector<float> xf = to_f32(x), wf = to_f32(w), dyf = to_f32(dy);
    const WeightView wv{DType::kF32, wf.data(), out, in};
    std::vector<uint16_t> wt(static_cast<size_t>(in * out));
    transpose_to_bf16(ctx, wv, wt.data());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) ASSERT_EQ(wt[k * out + o], f32_to_bf16(wf[o * in + k])) << o << "," << k;
    const WeightView wt_rm{DType::kBF16, wt.data(), in, out};
    const PanelSizes sizes = panel_sizes(wt_rm);
    std::vector<uint32_t> panels(static_cast<size_t>(sizes.data_bytes / 4) + 16);
    uint32_t* aligned = panels.data() + (64 - reinterpret_cast<uintptr_t>(panels.data()) % 64) % 64 / 4;
    const WeightView wt_packed = pack_panels(ctx, wt_rm, aligned, nullptr, nullptr, 0, sizes.panels);
    std::vector<uint16_t> w_bf16(static_cast<size_t>(out * in));
    for (int64_t i = 0; i < out * in; ++i) w_bf16[i] = f32_to_bf16(wf[i]);
    const WeightView w_rm{DType::kBF16, w_bf16.data(), out, in};
    const PanelSizes w_sizes = panel_sizes(w_rm);
    std::vector<uint32_t> w_panels(static_cast<size_t>(w_sizes.data_bytes / 4) + 16);
    uint32_t* w_aligned = w_panels.data() + (64 - reinterpret_cast<uintptr_t>(w_panels.data()) % 64) % 64 / 4;
    const WeightView wt_view = transposed_panels(pack_panels(ctx, w_rm, w_aligned, nullptr, nullptr, 0, w_sizes.panels));
    Vec want_db(out, 0.0);  // the bias gradient sums the unrounded dy
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o) want_db[o] += dy[i * out + o];
    for (const WeightView* laid : {static_cast<const WeightView*>(nullptr), &wt_packed, &wt_view}) {
      std::vector<float> dx(n * in, 1.0f), dw(out * in, 2.0f), db(out, 3.0f);  // accumulated into
      matmul_nt_backward(ctx, xf.data(), n, wv, dyf.data(), dx.data(), dw.data(), db.data(), laid);
      for (float& v : dx) v -= 1.0f;
      for (float& v : dw) v -= 2.0f;
      for (float& v : db) v -= 3.0f;
      expect_grad(want_dx, dx.data(), 1e-5, laid ? "dx (wᵀ laid out)" : "dx (wᵀ per call)");
      expect_grad(want_dw, dw.data(), 1e-5, "dw");
      expect_grad(want_db, db.data(), 1e-6, "db");
    }
  }
}

// dW = dyᵀ·x read in place: the fast bf16 kernel (AMX tiles where allowed) against the reference kernel
// on the same bf16-rounded operands (only the summation order differs), on shapes with tails in every
// dimension: odd token counts (a zero-padded last pair), rows past the last whole tile block, partial
// column panels, more tokens than one block of pairs; accumulating into y; and the same bits whatever
// the thread count.
TEST_P(BackwardTest, MatmulTnAddBf16MatchesReference) {
  Context fast = ctx_;
  fast.matmul_precision = MatmulPrecision::kBF16;
  if (!bf16_backward(fast)) GTEST_SKIP() << "no AVX512_BF16";
  Context ref = fast;
  ref.reference_kernels = true;
  for (const auto [n, m, k] : {std::array<int64_t, 3>{1, 1, 1}, {7, 33, 65}, {37, 97, 130}, {256, 200, 150},
                               {1031, 45, 70}}) {
    SCOPED_TRACE(std::to_string(n) + " tokens, dy " + std::to_string(m) + " wide, x " + std::to_string(k) + " wide");
    auto round = [](Vec v) {
      for (double& e : v) e = bf16_to_f32(f32_to_bf16(static_cast<float>(e)));
      return v;
    };
    const Vec a = random_doubles(n * m, 31), b = random_doubles(n * k, 32, 0.5), y0 = random_doubles(m * k, 33);
    std::vector<float> want = to_f32(y0), got = to_f32(y0);
    matmul_tn_add(ref, to_f32(round(a)).data(), n, m, to_f32(round(b)).data(), k, want.data());
    matmul_tn_add(fast, to_f32(a).data(), n, m, to_f32(b).data(), k, got.data());  // rounds a and b itself
    Vec abs_sum(m * k, 0.0);  // Σ_t |a[t, i] b[t, j]|: the scale of the summation-order difference
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) abs_sum[i * k + j] += std::abs(a[t * m + i] * b[t * k + j]);
    for (int64_t i = 0; i < m * k; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4 * abs_sum[i] + 1e-6) << "index " << i;
    ThreadPool three(3);  // other thread counts: the same bits
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &three}) {
      Context other = fast;
      other.pool = pool;
      std::vector<float> again = to_f32(y0);
      matmul_tn_add(other, to_f32(a).data(), n, m, to_f32(b).data(), k, again.data());
      ASSERT_EQ(again, got);
    }
  }
}

// matmul_tn overwrites y: the same bits as matmul_tn_add into zeros, whatever y held (NaN here), in the
// fast bf16 kernel and the f32 reference, over one and several blocks of pairs; zeros for no rows; and
// matmul_nt_backward's GradWrite::kOverwrite likewise for dW and dbias (dx still adds), and its dx_write
// kOverwrite for dx.
TEST_P(BackwardTest, MatmulTnOverwriteEqualsAddIntoZeros) {
  for (const MatmulPrecision precision : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
    Context ctx = ctx_;
    ctx.matmul_precision = precision;
    if (precision == MatmulPrecision::kBF16 && !bf16_backward(ctx)) continue;
    for (const auto [n, m, k] : {std::array<int64_t, 3>{0, 5, 7}, {7, 33, 65}, {1031, 45, 70}}) {
      SCOPED_TRACE(std::to_string(n) + " tokens, " + std::to_string(m) + " × " + std::to_string(k));
      const std::vector<float> a = to_f32(random_doubles(n * m, 41)), b = to_f32(random_doubles(n * k, 42));
      std::vector<float> added(m * k, 0.0f), written(m * k, std::nanf(""));
      matmul_tn_add(ctx, a.data(), n, m, b.data(), k, added.data());
      matmul_tn(ctx, a.data(), n, m, b.data(), k, written.data());
      ASSERT_EQ(0, std::memcmp(added.data(), written.data(), added.size() * sizeof(float)));
      if (n == 0) continue;
      // matmul_nt_backward of y = x·wᵀ + bias with w [m, k]: dy [n, m], x [n, k].
      const std::vector<float> w = to_f32(random_doubles(m * k, 43));
      std::vector<float> dx_add(n * k, 1.0f), dx_written(n * k, 1.0f), dw_add(m * k, 0.0f), db_add(m, 0.0f);
      std::vector<float> dw_written(m * k, std::nanf("")), db_written(m, std::nanf(""));
      const WeightView wv{DType::kF32, w.data(), m, k};
      matmul_nt_backward(ctx, b.data(), n, wv, a.data(), dx_add.data(), dw_add.data(), db_add.data());
      matmul_nt_backward(ctx, b.data(), n, wv, a.data(), dx_written.data(), dw_written.data(), db_written.data(),
                         nullptr, GradWrite::kOverwrite);
      ASSERT_EQ(0, std::memcmp(dw_add.data(), dw_written.data(), dw_add.size() * sizeof(float)));
      ASSERT_EQ(0, std::memcmp(db_add.data(), db_written.data(), db_add.size() * sizeof(float)));
      ASSERT_EQ(dx_add, dx_written);
      for (const bool reference : {false, true}) {  // dx_write kOverwrite: dx written, not added to
        Context c = ctx;
        c.reference_kernels = reference;
        std::vector<float> dx_zeros(n * k, 0.0f), dx_over(n * k, std::nanf(""));
        matmul_nt_backward(c, b.data(), n, wv, a.data(), dx_zeros.data(), nullptr, nullptr);
        matmul_nt_backward(c, b.data(), n, wv, a.data(), dx_over.data(), nullptr, nullptr, nullptr, GradWrite::kAdd,
                           GradWrite::kOverwrite);
        ASSERT_EQ(0, std::memcmp(dx_zeros.data(), dx_over.data(), dx_zeros.size() * sizeof(float))) << reference;
      }
    }
  }
}

// Double reference of ops/attention.h (valid mask, GQA, zero rows for padding).
Vec attention_ref(const AttentionShape& s, const Vec& q, const Vec& k, const Vec& v, const uint8_t* valid) {
  const int64_t B = s.n_batch, L = s.n_seq, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  Vec out(B * L * H * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        if (valid && !valid[b * L + i]) continue;
        const int64_t hk = h / (H / Hkv);
        Vec sc(L, -1e300);
        double mx = -1e300;
        for (int64_t j = 0; j < L; ++j) {
          if (valid && !valid[b * L + j]) continue;
          double d = 0;
          for (int64_t t = 0; t < D; ++t) d += q[((b * L + i) * H + h) * D + t] * k[((b * L + j) * Hkv + hk) * D + t];
          sc[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < L; ++j)
          if (!(valid && !valid[b * L + j])) sum += std::exp(sc[j] - mx);
        for (int64_t j = 0; j < L; ++j) {
          if (valid && !valid[b * L + j]) continue;
          const double p = std::exp(sc[j] - mx) / sum;
          for (int64_t t = 0; t < D; ++t) out[((b * L + i) * H + h) * D + t] += p * v[((b * L + j) * Hkv + hk) * D + t];
        }
      }
  return out;
}

TEST_P(BackwardTest, AttentionWithPaddingAndGqa) {
  const AttentionShape s{2, 5, 4, 2, 8};
  const std::vector<uint8_t> valid = {0, 0, 1, 1, 1, 1, 1, 1, 1, 1};  // row 0 left-padded by 2
  const int64_t nq = s.n_batch * s.n_seq * s.n_head * s.head_dim, nkv = s.n_batch * s.n_seq * s.n_head_kv * s.head_dim;
  const Vec q = random_doubles(nq, 15), k = random_doubles(nkv, 16), v = random_doubles(nkv, 17), c = random_doubles(nq, 18);
  for (const uint8_t* mask : {static_cast<const uint8_t*>(nullptr), valid.data()}) {
    const Vec want_dq = numeric_grad([&](const Vec& x) { return dot(c, attention_ref(s, x, k, v, mask)); }, q);
    const Vec want_dk = numeric_grad([&](const Vec& x) { return dot(c, attention_ref(s, q, x, v, mask)); }, k);
    const Vec want_dv = numeric_grad([&](const Vec& x) { return dot(c, attention_ref(s, q, k, x, mask)); }, v);
    const std::vector<float> qf = to_f32(q), kf = to_f32(k), vf = to_f32(v);
    for (bool reference : {false, true}) {  // the GEMM kernel and the reference loops
      Context ctx = ctx_;
      ctx.reference_kernels = reference;
      std::vector<float> out(nq), dq(nq, 7.0f), dk(nkv, 7.0f), dv(nkv, 7.0f);  // overwritten
      attention(ctx, s, qf.data(), kf.data(), vf.data(), mask, out.data());
      attention_backward(ctx, s, qf.data(), kf.data(), vf.data(), mask, out.data(), to_f32(c).data(), dq.data(),
                         dk.data(), dv.data());
      expect_grad(want_dq, dq.data(), 1e-5, "dq");
      expect_grad(want_dk, dk.data(), 1e-5, "dk");
      expect_grad(want_dv, dv.data(), 1e-5, "dv");
    }
  }
}

// The GEMM attention backward against the reference loops at model-like sizes (head dims 40 / 64,
// GQA groups 1 / 2 / 7, odd lengths, left padding), equal up to summation order.
TEST_P(BackwardTest, AttentionFastMatchesReference) {
  for (const AttentionShape s : {AttentionShape{1, 37, 4, 4, 40}, AttentionShape{2, 130, 14, 2, 64},
                                 AttentionShape{1, 64, 7, 1, 64}}) {
    SCOPED_TRACE("L " + std::to_string(s.n_seq) + " H " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv));
    const int64_t nq = s.n_batch * s.n_seq * s.n_head * s.head_dim, nkv = s.n_batch * s.n_seq * s.n_head_kv * s.head_dim;
    const std::vector<float> q = to_f32(random_doubles(nq, 31)), k = to_f32(random_doubles(nkv, 32)),
                             v = to_f32(random_doubles(nkv, 33)), dout = to_f32(random_doubles(nq, 34));
    std::vector<uint8_t> valid(s.n_batch * s.n_seq, 1);
    for (int64_t i = 0; i < 5; ++i) valid[i] = 0;  // row 0 left-padded by 5
    for (const uint8_t* mask : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(valid.data())}) {
      std::vector<float> out(nq);
      attention(ctx_, s, q.data(), k.data(), v.data(), mask, out.data());
      std::vector<std::vector<float>> got;
      for (bool reference : {true, false}) {
        Context ctx = ctx_;
        ctx.reference_kernels = reference;
        std::vector<float> dq(nq, 7.0f), dk(nkv, 7.0f), dv(nkv, 7.0f);
        attention_backward(ctx, s, q.data(), k.data(), v.data(), mask, out.data(), dout.data(), dq.data(), dk.data(),
                           dv.data());
        got.push_back(dq), got.push_back(dk), got.push_back(dv);
      }
      for (int w = 0; w < 3; ++w) {
        const Vec ref(got[w].begin(), got[w].end());
        expect_grad(ref, got[3 + w].data(), 2e-5, w == 0 ? "dq" : w == 1 ? "dk" : "dv");
      }
    }
  }
}

// Mixed precision (bf16_backward): the softmax in f32, the gradient products on bf16 operands. Against
// the f32 reference loops at model-like sizes, with score spreads of 1 and 3 (q scaled: a peaked softmax),
// within the tolerance ops/attention.h states (2e-2 of the largest gradient; the f32 fast kernel above
// holds 2e-5, so bf16 rounding is what this allows), and the
// same bits whatever the thread count (each (batch, KV head) is one thread's).
TEST_P(BackwardTest, AttentionBf16WithinToleranceOfF32) {
  Context fast = ctx_;
  fast.matmul_precision = MatmulPrecision::kBF16;
  if (!bf16_backward(fast)) GTEST_SKIP() << "no AVX512_BF16";
  Context ref = ctx_;
  ref.reference_kernels = true;
  for (const auto& [s, q_scale] : {std::pair{AttentionShape{2, 130, 14, 2, 64}, 1.0}, {AttentionShape{1, 256, 2, 1, 64}, 1.0},
                                   {AttentionShape{2, 130, 14, 2, 64}, 3.0}}) {
    SCOPED_TRACE("L " + std::to_string(s.n_seq) + " H " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                 ", q scale " + std::to_string(q_scale));
    const int64_t nq = s.n_batch * s.n_seq * s.n_head * s.head_dim, nkv = s.n_batch * s.n_seq * s.n_head_kv * s.head_dim;
    const std::vector<float> q = to_f32(random_doubles(nq, 51, q_scale)), k = to_f32(random_doubles(nkv, 52)),
                             v = to_f32(random_doubles(nkv, 53)), dout = to_f32(random_doubles(nq, 54));
    std::vector<uint8_t> valid(s.n_batch * s.n_seq, 1);
    for (int64_t i = 0; i < 5; ++i) valid[i] = 0;  // row 0 left-padded by 5
    std::vector<float> out(nq);
    attention(ref, s, q.data(), k.data(), v.data(), valid.data(), out.data());
    const AttentionShape shape = s;  // (clang 14 cannot capture a structured binding)
    auto run = [&](const Context& ctx) {
      std::vector<float> dq(nq, 7.0f), dk(nkv, 7.0f), dv(nkv, 7.0f);
      attention_backward(ctx, shape, q.data(), k.data(), v.data(), valid.data(), out.data(), dout.data(), dq.data(),
                         dk.data(), dv.data());
      return std::array<std::vector<float>, 3>{dq, dk, dv};
    };
    const auto want = run(ref), got = run(fast);
    for (int w = 0; w < 3; ++w) {  // measured: 3.2e-3 to 5.3e-3 of the largest gradient at q scale 1, to 9.6e-3 at 3
      double err = 0, max_ref = 0;
      for (size_t i = 0; i < want[w].size(); ++i) {
        err = std::max(err, static_cast<double>(std::abs(got[w][i] - want[w][i])));
        max_ref = std::max(max_ref, static_cast<double>(std::abs(want[w][i])));
      }
      const char* name = w == 0 ? "dq" : w == 1 ? "dk" : "dv";
      EXPECT_LT(err, 2e-2 * max_ref) << name;
      EXPECT_GT(err, 1e-7 * max_ref) << name;  // the bf16 products do round: not the f32 result bit for bit
    }
    ThreadPool three(3);
    Context other = fast;
    other.pool = &three;
    ASSERT_EQ(run(other), got);
  }
}

TEST_P(BackwardTest, CrossEntropyValueAndGradient) {
  const int64_t n = 3, V = 50;
  const Vec logits = random_doubles(n * V, 19, 3.0);
  const std::vector<int32_t> targets = {4, 49, 0};
  const std::vector<float> weights = {0.5f, 2.0f, 1.25f};
  auto f = [&](const Vec& x) {
    double s = 0;
    for (int64_t r = 0; r < n; ++r) {
      double mx = -1e300, sum = 0;
      for (int64_t c = 0; c < V; ++c) mx = std::max(mx, x[r * V + c]);
      for (int64_t c = 0; c < V; ++c) sum += std::exp(x[r * V + c] - mx);
      s += weights[r] * (mx + std::log(sum) - x[r * V + targets[r]]);
    }
    return s;
  };
  const Vec want = numeric_grad(f, logits);
  std::vector<float> lf = to_f32(logits), ce(n);
  const double loss = cross_entropy(ctx_, lf.data(), targets.data(), weights.data(), n, V, lf.data(), ce.data());
  EXPECT_NEAR(loss, f(logits), 1e-5 * std::abs(f(logits)));
  EXPECT_NEAR(weights[0] * ce[0] + weights[1] * ce[1] + weights[2] * ce[2], loss, 1e-4);
  expect_grad(want, lf.data(), 1e-5, "dlogits (in place)");
}

INSTANTIATE_TEST_SUITE_P(Threads, BackwardTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace dc
