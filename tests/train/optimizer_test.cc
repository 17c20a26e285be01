// AdamW against torch.optim.AdamW (ten steps with a warmup + cosine schedule, fixtures from
// tests/reference/make_grad_fixtures.py), the learning-rate schedules and global-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "fixtures.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "ops/matmul.h"
#include "train/optimizer.h"
#include "types/model_config.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;
const fs::path kGradDir = DC_GRAD_FIXTURES_DIR;

std::vector<float> tensor(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  const float* p = static_cast<const float*>(t->data);
  int64_t n = 1;
  for (int64_t d : t->shape) n *= d;
  return std::vector<float>(p, p + n);
}

TEST(AdamW, TenStepsMatchTorchOptimAdamW) {
  ASSERT_TRUE(fs::exists(kGradDir / ".complete")) << "run `ctest -R grad_fixtures` first";
  const auto hp = testing::load_json((kGradDir / "adamw.json").string());
  auto file = SafetensorsFile::open((kGradDir / "adamw.safetensors").string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  LrOptions lr;
  lr.schedule = LrSchedule::kCosine;
  lr.lr = hp["lr"], lr.warmup_steps = hp["warmup"], lr.total_steps = hp["total"], lr.min_lr_ratio = hp["min_lr_ratio"];
  const auto lrs = hp["lrs"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<int64_t>(lrs.size()), lr.total_steps);
  for (const std::string name : {"matrix", "vector"}) {
    SCOPED_TRACE(name);
    std::vector<float> p = tensor(*file, "p0." + name), m(p.size(), 0.0f), v(p.size(), 0.0f);
    const double wd = name == "matrix" ? hp["weight_decay"].get<double>() : 0.0;  // the fixture's param groups
    for (int64_t step = 0; step < lr.total_steps; ++step) {
      const double rate = learning_rate(lr, step);
      EXPECT_NEAR(rate, lrs[step], 1e-12 * hp["lr"].get<double>()) << "step " << step;
      const std::vector<float> g = tensor(*file, "g" + std::to_string(step) + "." + name);
      adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(p.size()), step + 1, rate, hp["beta1"],
                   hp["beta2"], hp["eps"], wd);
    }
    const std::vector<float> want = tensor(*file, "final." + name);
    ASSERT_EQ(want.size(), p.size());
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_NEAR(p[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i]))) << "value " << i;
  }
}

TEST(AdamW, StepDecaysMatricesButNotNormsAndBiases) {
  ModelConfig c;
  c.n_vocab = 8, c.n_embd = 4, c.n_head = 2, c.n_head_kv = 1, c.head_dim = 2, c.n_ff = 6, c.n_layer = 1;
  ModelParams p = ModelParams::zeros(c), g = ModelParams::zeros(c), m = ModelParams::zeros(c), v = ModelParams::zeros(c);
  for (const auto& t : p.tensors())
    for (int64_t i = 0; i < t.size; ++i) t.data[i] = 1.0f;  // zero gradients: only the decay moves p
  AdamWOptions o;
  o.weight_decay = 0.5;
  adamw_step(p, g, m, v, 1, 0.1, o, nullptr);
  int matrices = 0, vectors = 0;
  for (const auto& t : p.tensors()) {
    const float want = t.is_matrix ? 0.95f : 1.0f;
    for (int64_t i = 0; i < t.size; ++i) ASSERT_FLOAT_EQ(t.data[i], want) << t.name << "[" << i << "]";
    (t.is_matrix ? matrices : vectors)++;
  }
  EXPECT_GT(matrices, 0);
  EXPECT_GT(vectors, 0);
}

// Mixed precision's fused step: the same weights and moments bit for bit as clip_grad_norm then
// adamw_step, and bf16 copies equal to those a fresh refresh() makes of the updated weights; Wᵀ is a
// view of the same words (one copy).
TEST(AdamW, MixedStepMatchesClipThenStepAndARefresh) {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  ctx.matmul_precision = MatmulPrecision::kBF16;
  if (!bf16_backward(ctx)) GTEST_SKIP() << "no AVX512_BF16";
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied lm_head" : "untied lm_head");
    ModelConfig c;
    c.n_vocab = 70, c.n_embd = 40, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 10, c.n_ff = 72, c.n_layer = 2;
    c.tie_word_embeddings = tied;
    ModelParams p = ModelParams::zeros(c), g = ModelParams::zeros(c), m = ModelParams::zeros(c), v = ModelParams::zeros(c);
    ModelParams p2 = ModelParams::zeros(c), g2 = ModelParams::zeros(c), m2 = ModelParams::zeros(c), v2 = ModelParams::zeros(c);
    std::mt19937 gen(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < p.tensors().size(); ++i)
      for (int64_t j = 0; j < p.tensors()[i].size; ++j) {
        p.tensors()[i].data[j] = p2.tensors()[i].data[j] = 0.05f * dist(gen);
        g.tensors()[i].data[j] = g2.tensors()[i].data[j] = dist(gen);  // norm ≫ 1: clipping scales
        m.tensors()[i].data[j] = m2.tensors()[i].data[j] = 0.1f * dist(gen);
        v.tensors()[i].data[j] = v2.tensors()[i].data[j] = 0.01f * std::fabs(dist(gen));
      }
    AdamWOptions o;
    o.weight_decay = 0.1;
    MixedPrecisionWeights mixed;
    ASSERT_TRUE(mixed.refresh(ctx, p.weights()).ok());
    const double norm = global_grad_norm(g, &pool);
    adamw_step_mixed(ctx, p, g, m, v, 2, 1e-3, o, clip_coefficient(norm, 1.0), mixed);
    EXPECT_DOUBLE_EQ(clip_grad_norm(g2, 1.0, &pool), norm);
    adamw_step(p2, g2, m2, v2, 2, 1e-3, o, &pool);
    for (const auto* pair : {&p, &m, &v}) {
      const ModelParams& want = pair == &p ? p2 : pair == &m ? m2 : v2;
      for (size_t i = 0; i < want.tensors().size(); ++i)
        ASSERT_EQ(std::memcmp(pair->tensors()[i].data, want.tensors()[i].data, want.tensors()[i].size * 4), 0)
            << want.tensors()[i].name;
    }
    ASSERT_TRUE(mixed.refresh(ctx, p.weights()).ok());  // keeps what the optimizer wrote
    MixedPrecisionWeights fresh;
    ASSERT_TRUE(fresh.refresh(ctx, p.weights()).ok());
    auto same = [](const WeightView& a, const WeightView& b, const char* what) {
      ASSERT_EQ(a.layout, WeightLayout::kPanels) << what;
      const int64_t words = (a.rows + kPanelRows - 1) / kPanelRows * ((a.cols + 1) / 2) * kPanelRows;
      ASSERT_NE(a.data, b.data) << what;
      EXPECT_EQ(std::memcmp(a.data, b.data, words * 4), 0) << what;
    };
    auto transposed_view = [](const WeightView& t, const WeightView& w, const char* what) {
      EXPECT_EQ(t.layout, WeightLayout::kPanelsTransposed) << what;
      EXPECT_EQ(t.data, w.data) << what;
      EXPECT_EQ(t.rows, w.cols) << what;
      EXPECT_EQ(t.cols, w.rows) << what;
    };
    for (size_t il = 0; il < p.weights().layers.size(); ++il)
      for (auto f : {&LayerWeights::wq, &LayerWeights::wk, &LayerWeights::wv, &LayerWeights::wo, &LayerWeights::w_gate,
                     &LayerWeights::w_up, &LayerWeights::w_down}) {
        same(mixed.forward().layers[il].*f, fresh.forward().layers[il].*f, "W");
        transposed_view(mixed.transposed().layers[il].*f, mixed.forward().layers[il].*f, "Wᵀ");
      }
    same(mixed.forward().output, fresh.forward().output, "lm_head W");
    transposed_view(mixed.transposed().output, mixed.forward().output, "lm_head Wᵀ");
    EXPECT_EQ(mixed.forward().layers[1].ffn_norm.data(), p.weights().layers[1].ffn_norm.data());  // views of the master's vectors
  }
}

TEST(LearningRate, WarmupThenConstantLinearAndCosine) {
  LrOptions o;
  o.lr = 1.0, o.warmup_steps = 4, o.total_steps = 14, o.min_lr_ratio = 0.1;
  for (LrSchedule s : {LrSchedule::kConstant, LrSchedule::kLinear, LrSchedule::kCosine}) {
    o.schedule = s;
    EXPECT_DOUBLE_EQ(learning_rate(o, 0), 0.0);  // Hugging Face warmup: the first step has rate 0
    EXPECT_DOUBLE_EQ(learning_rate(o, 2), 0.5);
    EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1.0);
  }
  o.schedule = LrSchedule::kConstant;
  EXPECT_DOUBLE_EQ(learning_rate(o, 13), 1.0);
  o.schedule = LrSchedule::kLinear;
  EXPECT_NEAR(learning_rate(o, 9), 0.1 + 0.9 * 0.5, 1e-12);  // halfway through [4, 14)
  EXPECT_NEAR(learning_rate(o, 14), 0.1, 1e-12);
  o.schedule = LrSchedule::kCosine;
  EXPECT_NEAR(learning_rate(o, 9), 0.1 + 0.9 * 0.5, 1e-12);  // cos(π/2) = 0
  EXPECT_NEAR(learning_rate(o, 14), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 100), 0.1, 1e-12);  // past the end it stays at the floor
  EXPECT_FALSE(parse_lr_schedule("cosine_with_restarts").ok());
  EXPECT_NE(parse_lr_schedule("nope").status().message().find("--lr-schedule"), std::string::npos);
}

TEST(ClipGradNorm, ScalesToTheMaximumOnlyWhenAbove) {
  ModelConfig c;
  c.n_vocab = 8, c.n_embd = 4, c.n_head = 2, c.n_head_kv = 1, c.head_dim = 2, c.n_ff = 6, c.n_layer = 1;
  ModelParams g = ModelParams::zeros(c);
  const auto& ts = g.tensors();
  ts[0].data[0] = 3.0f, ts.back().data[0] = 4.0f;  // norm 5
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 10.0), 5.0);
  EXPECT_FLOAT_EQ(ts[0].data[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 1.0), 5.0);
  EXPECT_NEAR(global_grad_norm(g), 1.0, 1e-6);
  EXPECT_NEAR(ts[0].data[0], 0.6, 1e-6);
  EXPECT_NEAR(clip_grad_norm(g, 0.0), 1.0, 1e-6);  // 0: report only
}

// The gradient norm's sums, bit for bit as documented (optimizer.h): per chunk of 64 Ki values of each
// tensor (of the flat buffer for sum_of_squares) 8 double lanes, lane l taking values j + l in order, the
// last n % 8 values lane 0, the lanes combined pairwise, the chunks summed in order. Tensors of several
// chunks with a partial last one, tensors shorter than 8 values, a chunk count that is no multiple of the
// kernel's group of 4, and any thread count.
TEST(AdamW, GradNormSumsAreTheDocumentedOnes) {
  ModelConfig c;
  c.n_vocab = 40001, c.n_embd = 4, c.n_head = 2, c.n_head_kv = 1, c.head_dim = 2, c.n_ff = 6, c.n_layer = 2;
  ModelParams g = ModelParams::zeros(c);
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < g.n_values(); ++i) g.data()[i] = dist(gen);
  auto chunk = [](const float* x, int64_t n) {
    double lane[8] = {};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
      for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[j + l]) * x[j + l];
    for (; j < n; ++j) lane[0] += static_cast<double>(x[j]) * x[j];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  };
  auto chunked = [&](const float* x, int64_t n) {
    double s = 0;
    for (int64_t b = 0; b < n; b += 65536) s += chunk(x + b, std::min<int64_t>(65536, n - b));
    return s;
  };
  double want = 0;  // chunks in order over every tensor
  for (const auto& t : g.tensors()) {
    for (int64_t b = 0; b < t.size; b += 65536) want += chunk(t.data + b, std::min<int64_t>(65536, t.size - b));
  }
  const double want_flat = chunked(g.data(), g.n_values());
  ASSERT_GT(g.tensors()[0].size, 2 * 65536);
  ThreadPool three(3);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &three}) {
    EXPECT_EQ(global_grad_norm(g, pool), std::sqrt(want));
    EXPECT_EQ(sum_of_squares(g.data(), g.n_values(), pool), want_flat);
    EXPECT_EQ(sum_of_squares(g.data() + 3, 5, pool), chunk(g.data() + 3, 5));
    // One chunk's sum alone (the others zero, so adding them is exact), in a group of 4 chunks and in the
    // 13-value remainder after it: each chunk's lanes bit for bit, not just a total they are absorbed into.
    std::vector<float> one(4 * 65536 + 13);
    for (int64_t k = 0; k < 5; ++k) {
      const int64_t b = k * 65536, n = std::min<int64_t>(65536, static_cast<int64_t>(one.size()) - b);
      std::fill(one.begin(), one.end(), 0.0f);
      for (int64_t i = 0; i < n; ++i) one[b + i] = dist(gen);
      EXPECT_EQ(sum_of_squares(one.data(), static_cast<int64_t>(one.size()), pool), chunk(one.data() + b, n)) << k;
    }
  }
}

// ZeRO's step over shards of the flat buffer (cut inside tensors, e.g. [0, 37), [37, 101), ...): the
// same weights and moments bit for bit as adamw_step over the whole model, with the clip coefficient and
// each tensor's own weight decay; the shards' Σ g² add up to the global norm's.
TEST(AdamW, ShardedStepsMatchTheWholeStep) {
  ModelConfig c;
  c.n_vocab = 8, c.n_embd = 4, c.n_head = 2, c.n_head_kv = 1, c.head_dim = 2, c.n_ff = 6, c.n_layer = 2;
  ModelParams p = ModelParams::zeros(c), g = ModelParams::zeros(c), m = ModelParams::zeros(c), v = ModelParams::zeros(c);
  ModelParams p2 = ModelParams::zeros(c);
  const int64_t n = p.n_values();
  for (int64_t i = 0; i < n; ++i) {
    p.data()[i] = p2.data()[i] = 0.1f * static_cast<float>(std::sin(0.7 * i));
    g.data()[i] = static_cast<float>(std::cos(1.3 * i));
  }
  AdamWOptions o;
  o.weight_decay = 0.1;
  const float clip = clip_coefficient(global_grad_norm(g), 0.5);
  ASSERT_LT(clip, 1.0f);
  const int ranks = 3;
  std::vector<std::vector<float>> ms(ranks), vs(ranks);
  double sum_sq = 0;
  for (int t = 1; t <= 3; ++t) {
    ModelParams scaled = ModelParams::zeros(c);  // clip_grad_norm's in-place scaling, on a copy
    for (int64_t i = 0; i < n; ++i) scaled.data()[i] = g.data()[i] * clip;
    adamw_step(p, scaled, m, v, t, 1e-2, o, nullptr);
    sum_sq = 0;
    for (int r = 0; r < ranks; ++r) {
      const dist::Range s = dist::shard_range(n, r, ranks);
      ms[r].resize(s.size()), vs[r].resize(s.size());
      adamw_shard(p2, s, g.data() + s.begin, ms[r].data(), vs[r].data(), t, 1e-2, o, clip, nullptr);
      sum_sq += sum_of_squares(g.data() + s.begin, s.size());
    }
  }
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), n * sizeof(float)), 0);
  for (int r = 0; r < ranks; ++r) {
    const dist::Range s = dist::shard_range(n, r, ranks);
    EXPECT_EQ(std::memcmp(m.data() + s.begin, ms[r].data(), s.size() * sizeof(float)), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(v.data() + s.begin, vs[r].data(), s.size() * sizeof(float)), 0) << "rank " << r;
  }
  EXPECT_NEAR(std::sqrt(sum_sq), global_grad_norm(g), 1e-12 * global_grad_norm(g));
}

}  // namespace
}  // namespace dc::train
