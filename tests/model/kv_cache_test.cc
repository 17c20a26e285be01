// Model::forward with a KV cache (spec §6) on the fixture checkpoints: a refresh is the plain forward
// (bit-identical logits), kUse over the whole sequence is the plain forward, kUse over a window with a
// freshly refreshed cache and unchanged tokens reproduces the window's rows, a one-layer model is exact
// under kUse even after the window's tokens change (its other positions' K/V cannot change), and bad
// window / cache combinations are rejected. The same for a scattered window (window_positions, cache
// committed): it reproduces the full forward's rows with a fresh cache, is exact on one layer after its
// positions' tokens change (and stores their K/V where later forwards read them), and bad sets are rejected;
// with a list per row (window_row_begin) each row computes as it would alone.
// Several requests' parts in one forward (forward_hidden_parts: refresh, kUse and uncached parts of their own
// shapes) give each part's own rows and cache (bit for bit with the reference kernels, within 1e-5 relative
// with the fast ones: their path depends on a product's row count), and bad parts are rejected naming the part.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>

#include "batch_case.h"
#include "fixtures.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace dc {
namespace {

std::vector<std::unique_ptr<Model>> fixture_models() {
  std::vector<std::unique_ptr<Model>> models;
  const auto manifest = dc::testing::load_manifest();
  for (const auto& m : manifest["models"]) {
    auto model = Model::load(dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>());
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    if (model.ok()) models.push_back(std::move(*model));
  }
  EXPECT_FALSE(models.empty());
  return models;
}

// max |a − b| / max |b|.
double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    ref = std::max(ref, static_cast<double>(std::abs(b[i])));
  }
  return diff / ref;
}

// The first n_layer layers of `base` as a model of their own.
std::unique_ptr<Model> first_layers(const std::shared_ptr<const Model>& base, int64_t n_layer) {
  ModelConfig config = base->config();
  config.n_layer = n_layer;
  ModelWeights weights = base->weights();
  weights.layers.resize(static_cast<size_t>(n_layer));
  return Model::from_weights(config, std::move(weights), base);
}

// A cached forward after tokens changed, `rel` from the full forward: exact on one layer; on two, when
// `drift_expected`, visibly not (the approximation), which shows the test can tell.
void expect_exact_on_one_layer(double rel, int64_t n_layer, const std::string& what, bool drift_expected) {
  std::printf("  %ld layer(s), %s: rel max diff %.2e\n", static_cast<long>(n_layer), what.c_str(), rel);
  if (n_layer == 1) {
    EXPECT_LE(rel, 1e-6) << what;
  } else if (drift_expected) {
    EXPECT_GT(rel, 1e-4) << what << ": the approximation should be visible with two layers";
  }
}

TEST(KvCache, RefreshAndFullWindowUseEqualThePlainForwardBitForBit) {
  ThreadPool pool(2);
  const Context ctx{Device::kCpu, &pool};
  for (const auto& model : fixture_models()) {
    const ModelConfig& c = model->config();
    for (int64_t B : {1, 2}) {
      const BatchCase k = make_canvas(c, B, 11, 3);
      const std::vector<int64_t> rows = window_rows(k, 0, k.L);
      const size_t n = rows.size() * static_cast<size_t>(c.n_vocab);
      std::vector<float> plain(n), refreshed(n), used(n);
      ASSERT_TRUE(model->forward(ctx, k.view(rows, CacheOp::kNone, nullptr), plain.data()).ok());
      KvCache cache;
      ASSERT_TRUE(model->forward(ctx, k.view(rows, CacheOp::kRefresh, &cache), refreshed.data()).ok());
      EXPECT_TRUE(cache.filled());
      EXPECT_EQ(cache.bytes(), KvCache::bytes_for(c.n_layer, B, k.L, c.n_head_kv * c.head_dim));
      ASSERT_TRUE(model->forward(ctx, k.view(rows, CacheOp::kUse, &cache, 0, k.L), used.data()).ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(refreshed[i], plain[i]) << "refresh, B " << B << " index " << i;
        ASSERT_EQ(used[i], plain[i]) << "kUse over the whole sequence, B " << B << " index " << i;
      }
    }
  }
}

// A scattered window: positions `at` of [wb, we) computed, every other position's K/V from the cache.
ForwardBatch scattered_batch_of(const BatchCase& k, const std::vector<int64_t>& rows, KvCache* cache, int64_t wb, int64_t we,
                                const std::vector<int64_t>& at) {
  ForwardBatch b = k.view(rows, CacheOp::kUse, cache, wb, we);
  b.window_positions = at.data();
  b.n_window_positions = static_cast<int64_t>(at.size());
  return b;
}

// The real rows of the positions `at` of every batch row.
std::vector<int64_t> rows_at(const BatchCase& k, const std::vector<int64_t>& at) {
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < k.B; ++b)
    for (int64_t i : at)
      if (k.valid.empty() || k.valid[b * k.L + i]) rows.push_back(b * k.L + i);
  return rows;
}

TEST(KvCache, WindowWithFreshCacheReproducesTheFullForwardRows) {
  // Contiguous windows and scattered ones (window_positions, cache committed).
  ThreadPool pool(2);
  const Context ctx{Device::kCpu, &pool};
  const std::vector<std::vector<int64_t>> scattered = {{4, 6, 7, 10}, {0, 11}, {5}, {3, 4, 5, 6, 7, 8}};
  for (const auto& model : fixture_models()) {
    const ModelConfig& c = model->config();
    for (int64_t B : {1, 2}) {
      const BatchCase k = make_canvas(c, B, 12, 5);
      const std::vector<int64_t> all = window_rows(k, 0, k.L);
      std::vector<float> full(all.size() * c.n_vocab);
      KvCache cache;
      ASSERT_TRUE(model->forward(ctx, k.view(all, CacheOp::kRefresh, &cache), full.data()).ok());
      // Same tokens → the computed positions' fresh K/V equal the cached ones, so the cache stays valid.
      auto expect_full_rows = [&](const ForwardBatch& batch, const std::vector<int64_t>& rows, const std::string& what) {
        std::vector<float> got(rows.size() * c.n_vocab), want;
        for (int64_t r : rows) {
          const size_t at = static_cast<size_t>(std::find(all.begin(), all.end(), r) - all.begin());
          want.insert(want.end(), full.begin() + at * c.n_vocab, full.begin() + (at + 1) * c.n_vocab);
        }
        ASSERT_TRUE(model->forward(ctx, batch, got.data()).ok()) << what;
        EXPECT_LE(rel_max_diff(got, want), 1e-6) << "B " << B << ", " << what;
      };
      for (auto [wb, we] : {std::pair<int64_t, int64_t>{4, 9}, {0, 3}, {7, 12}, {5, 6}}) {
        const std::vector<int64_t> rows = window_rows(k, wb, we);
        expect_full_rows(k.view(rows, CacheOp::kUse, &cache, wb, we), rows,
                         "window [" + std::to_string(wb) + ", " + std::to_string(we) + ")");
      }
      for (const std::vector<int64_t>& at : scattered) {
        const std::vector<int64_t> rows = rows_at(k, at);
        expect_full_rows(scattered_batch_of(k, rows, &cache, 0, k.L, at), rows,
                         std::to_string(at.size()) + " scattered positions from " + std::to_string(at[0]));
      }
    }
  }
}

TEST(KvCache, BadWindowsAndCachesAreRejected) {
  ThreadPool pool(1);
  const Context ctx{Device::kCpu, &pool};
  auto models = fixture_models();
  ASSERT_FALSE(models.empty());
  const Model& model = *models[0];
  const BatchCase k = make_canvas(model.config(), 1, 8, 1);
  std::vector<int64_t> rows = {4};
  std::vector<float> logits(model.config().n_vocab * 8);
  auto message = [&](const ForwardBatch& b) { return model.forward(ctx, b, logits.data()).message(); };
  KvCache cache;
  EXPECT_NE(message(k.view(rows, CacheOp::kUse, &cache, 2, 6)).find("kRefresh"), std::string::npos);
  EXPECT_NE(message(k.view(rows, CacheOp::kNone, nullptr, 2, 6)).find("kUse"), std::string::npos);
  EXPECT_NE(message(k.view(rows, CacheOp::kRefresh, nullptr)).find("cache"), std::string::npos);
  EXPECT_NE(message(k.view(rows, CacheOp::kNone, nullptr, 3, 3)).find("window"), std::string::npos);
  EXPECT_NE(message(k.view(rows, CacheOp::kNone, nullptr, 0, 9)).find("window"), std::string::npos);
  ASSERT_TRUE(model.forward(ctx, k.view(rows, CacheOp::kRefresh, &cache), logits.data()).ok());
  rows = {1};
  EXPECT_NE(message(k.view(rows, CacheOp::kUse, &cache, 2, 6)).find("outside the window"), std::string::npos);
  const BatchCase longer = make_canvas(model.config(), 1, 9, 1);
  rows = {4};
  EXPECT_NE(message(longer.view(rows, CacheOp::kUse, &cache, 2, 6)).find("same batch shape"), std::string::npos);
  EXPECT_TRUE(model.forward(ctx, k.view(rows, CacheOp::kUse, &cache, 2, 6), logits.data()).ok());

  // Scattered windows (window_positions): ascending, inside the window, holding the out rows, with kUse.
  auto scattered = [&](const std::vector<int64_t>& at, int64_t wb, CacheOp op = CacheOp::kUse) {
    ForwardBatch b = k.view(rows, op, &cache, wb, -1);
    b.window_positions = at.data();
    b.n_window_positions = static_cast<int64_t>(at.size());
    return message(b);
  };
  EXPECT_NE(scattered({5, 4}, 2).find("window_positions[1] = 4 does not ascend"), std::string::npos) << scattered({5, 4}, 2);
  EXPECT_NE(scattered({4, 4}, 2).find("does not ascend"), std::string::npos);
  EXPECT_NE(scattered({1, 4}, 2).find("window_positions[0] = 1"), std::string::npos);
  EXPECT_NE(scattered({4, 8}, 2).find("window_positions[1] = 8"), std::string::npos);
  EXPECT_NE(scattered({3, 5}, 2).find("not one of the window_positions"), std::string::npos);
  EXPECT_NE(scattered({4}, 2, CacheOp::kNone).find("need cache_op kUse"), std::string::npos);
  const std::vector<int64_t> one = {4};
  ForwardBatch none_at = k.view(rows, CacheOp::kUse, &cache, 2, -1);
  none_at.window_positions = one.data();  // n_window_positions 0
  EXPECT_NE(message(none_at).find("at least one position"), std::string::npos);
  const std::vector<int64_t> fine = {3, 4};
  none_at.n_window_positions = 2, none_at.window_positions = fine.data();
  EXPECT_TRUE(model.forward(ctx, none_at, logits.data()).ok());

  // A list per row (window_row_begin): offsets rising from 0 to n_window_positions, each row's list ascending
  // inside the window (row 1's may start below row 0's end), each out row one of its own row's positions.
  const BatchCase two = make_canvas(model.config(), 2, 8, 1);  // row 1: 3 left pads
  KvCache two_cache;
  const std::vector<int64_t> two_rows = window_rows(two, 0, two.L);
  std::vector<float> two_logits(two_rows.size() * model.config().n_vocab);
  ASSERT_TRUE(model.forward(ctx, two.view(two_rows, CacheOp::kRefresh, &two_cache), two_logits.data()).ok());
  auto per_row = [&](const std::vector<int64_t>& at, const std::vector<int64_t>& row_begin, const std::vector<int64_t>& out) {
    ForwardBatch b = scattered_batch_of(two, out, &two_cache, 2, -1, at);
    b.window_row_begin = row_begin.data();
    return message(b);
  };
  EXPECT_EQ(per_row({4, 6, 3, 5}, {0, 2, 4}, {4, 8 + 3}), "");
  EXPECT_EQ(per_row({4, 6}, {0, 2, 2}, {6}), "");  // row 1 computes nothing
  EXPECT_NE(per_row({4, 5}, {0, 3, 2}, {4}).find("window_row_begin[2] = 2"), std::string::npos) << per_row({4, 5}, {0, 3, 2}, {4});
  EXPECT_NE(per_row({4, 5}, {0, 1, 1}, {4}).find("runs from 0 to 1; the row offsets must rise from 0 to n_window_positions (2)"),
            std::string::npos);
  EXPECT_NE(per_row({4, 5}, {1, 1, 2}, {4}).find("runs from 1 to 2"), std::string::npos);
  EXPECT_NE(per_row({4, 6, 5}, {0, 1, 3}, {4}).find("window_positions[2] = 5 does not ascend"), std::string::npos);
  EXPECT_NE(per_row({4, 7, 1}, {0, 2, 3}, {4}).find("window_positions[2] = 1"), std::string::npos);
  EXPECT_NE(per_row({4, 5}, {0, 1, 2}, {5}).find("not one of the window_positions of its row"), std::string::npos);
  const std::vector<int64_t> row_4 = {4};
  ForwardBatch offsets_alone = two.view(row_4, CacheOp::kUse, &two_cache, 2, -1);
  const std::vector<int64_t> offsets = {0, 1, 1};
  offsets_alone.window_row_begin = offsets.data();
  EXPECT_NE(message(offsets_alone).find("window_row_begin needs window_positions"), std::string::npos);
}

TEST(KvCache, OneLayerModelIsExactWhenOnlyTheComputedPositionsChange) {
  // With one layer the K/V of a position depend only on its own token: after the tokens of the positions a
  // kUse computes change (a window's, or scattered ones'), it must equal the full forward of the new canvas;
  // after scattered positions changed, so must a later forward of another position alone (it reads their
  // stored K/V). With two layers the first must not (the approximation), which shows the test can tell.
  ThreadPool pool(2);
  const Context ctx{Device::kCpu, &pool};
  auto loaded = fixture_models();
  ASSERT_FALSE(loaded.empty());
  std::shared_ptr<const Model> base(std::move(loaded[1]));  // tiny-gqa2 (3 layers, GQA 2)
  const std::vector<int64_t> window = {5, 6, 7, 8}, scattered = {5, 7, 8, 11}, other = {6};
  for (int64_t n_layer : {1, 2}) {
    const std::unique_ptr<Model> model = first_layers(base, n_layer);
    const ModelConfig& config = model->config();
    for (int64_t B : {1, 2}) {
      for (const std::vector<int64_t>* changed : {&window, &scattered}) {
        BatchCase k = make_canvas(config, B, 12, 9);
        const std::vector<int64_t> all = window_rows(k, 0, k.L);
        KvCache cache;
        std::vector<float> scratch(all.size() * config.n_vocab);
        ASSERT_TRUE(model->forward(ctx, k.view(all, CacheOp::kRefresh, &cache), scratch.data()).ok());
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i : *changed) k.tokens[b * k.L + i] = static_cast<int32_t>((k.tokens[b * k.L + i] + 101) % 300);
        const bool contiguous = changed == &window;
        for (const std::vector<int64_t>* computed : {changed, &other}) {
          if (contiguous && computed == &other) continue;
          const std::vector<int64_t> rows = rows_at(k, *computed);
          std::vector<float> got(rows.size() * config.n_vocab), want(rows.size() * config.n_vocab);
          const ForwardBatch batch = contiguous ? k.view(rows, CacheOp::kUse, &cache, 5, 9)
                                                : scattered_batch_of(k, rows, &cache, 4, k.L, *computed);
          ASSERT_TRUE(model->forward(ctx, batch, got.data()).ok());
          ASSERT_TRUE(model->forward(ctx, k.view(rows, CacheOp::kNone, nullptr), want.data()).ok());
          const std::string what = "B " + std::to_string(B) + (contiguous ? ", window [5, 9)" : ", scattered: ") +
                                   (contiguous ? "" : computed == changed ? "the changed positions" : "another position, afterwards");
          expect_exact_on_one_layer(rel_max_diff(got, want), n_layer, what, computed == changed);
        }
      }
    }
  }
}

// forward_hidden_parts: each part's hidden rows and cache equal its own forward_hidden's, bit for bit.
// Every part's hidden rows after those of the parts before it.
std::vector<float> hidden_of(const Model& model, const Context& ctx, std::span<const ForwardBatch> parts) {
  int64_t n_out = 0;
  for (const ForwardBatch& b : parts) n_out += b.n_out;
  std::vector<float> hidden(static_cast<size_t>(n_out * model.config().n_embd));
  const Status s = parts.size() == 1 ? model.forward_hidden(ctx, parts[0], hidden.data())
                                     : model.forward_hidden_parts(ctx, parts, hidden.data());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return hidden;
}

// The fast GEMM takes a dot-product path for few rows of x and the packed one for more (ops/cpu/matmul_fast.cc
// kSmallN): each row-wise, but with their own summation orders, so a part stacked with others may take the
// other path than alone. The reference kernels have one path: bit for bit there; the fast ones within `tol`.
void expect_close(const std::vector<float>& merged, const std::vector<float>& alone, double tol, const std::string& what) {
  ASSERT_EQ(merged.size(), alone.size()) << what;
  if (tol == 0) {
    ASSERT_EQ(merged, alone) << what;
  } else {
    const double rel = rel_max_diff(merged, alone);
    if (rel > 0) std::printf("  fast kernels, %s: rel max diff %.2e\n", what.c_str(), rel);
    EXPECT_LE(rel, tol) << what;
  }
}

void expect_same_cache(const KvCache& merged, const KvCache& alone, int64_t n_layer, double tol, const std::string& what) {
  ASSERT_TRUE(merged.filled() && merged.matches(n_layer, alone.n_batch(), alone.n_seq(), alone.kv_dim())) << what;
  const size_t n = static_cast<size_t>(alone.n_batch() * alone.n_seq() * alone.kv_dim());
  for (int64_t il = 0; il < n_layer; ++il) {
    expect_close({merged.k(il), merged.k(il) + n}, {alone.k(il), alone.k(il) + n}, tol, what + " K layer " + std::to_string(il));
    expect_close({merged.v(il), merged.v(il) + n}, {alone.v(il), alone.v(il) + n}, tol, what + " V layer " + std::to_string(il));
  }
}

// Refresh, kUse and uncached parts of their own shapes in one forward against each alone, within `tol`.
void expect_parts_equal_alone(const Model& model, const Context& ctx, double tol) {
  const ModelConfig& c = model.config();
  BatchCase a = make_canvas(c, 1, 12, 5), b = make_canvas(c, 2, 17, 9), u = make_canvas(c, 1, 9, 2);
  const std::vector<int64_t> rows_a = window_rows(a, 0, a.L), rows_b = window_rows(b, 0, b.L);
  const std::vector<int64_t> rows_u = window_rows(u, 0, u.L);
  KvCache alone_a, alone_b, merged_a, merged_b;
  // Refresh parts (a block's first step), with an uncached part between them.
  const ForwardBatch refresh_alone[] = {a.view(rows_a, CacheOp::kRefresh, &alone_a),
                                        u.view(rows_u, CacheOp::kNone, nullptr),
                                        b.view(rows_b, CacheOp::kRefresh, &alone_b)};
  const ForwardBatch refresh_merged[] = {a.view(rows_a, CacheOp::kRefresh, &merged_a), refresh_alone[1],
                                         b.view(rows_b, CacheOp::kRefresh, &merged_b)};
  std::vector<float> want;
  for (const ForwardBatch& part : refresh_alone) {
    const std::vector<float> h = hidden_of(model, ctx, {&part, 1});
    want.insert(want.end(), h.begin(), h.end());
  }
  expect_close(hidden_of(model, ctx, refresh_merged), want, tol, "refresh parts");
  expect_same_cache(merged_a, alone_a, c.n_layer, tol, "part a after refresh");
  expect_same_cache(merged_b, alone_b, c.n_layer, tol, "part b after refresh");
  // kUse parts over windows of their own after their tokens changed (the next steps of a block).
  for (int64_t i = 6; i < 10; ++i) a.tokens[i] = b.tokens[b.L + i + 3] = 17;
  const std::vector<int64_t> use_a = window_rows(a, 6, 10), use_b = window_rows(b, 8, 16);
  const ForwardBatch use_alone[] = {a.view(use_a, CacheOp::kUse, &alone_a, 6, 10),
                                    b.view(use_b, CacheOp::kUse, &alone_b, 8, 16)};
  const ForwardBatch use_merged[] = {a.view(use_a, CacheOp::kUse, &merged_a, 6, 10),
                                     b.view(use_b, CacheOp::kUse, &merged_b, 8, 16)};
  want = hidden_of(model, ctx, {&use_alone[0], 1});
  const std::vector<float> h_b = hidden_of(model, ctx, {&use_alone[1], 1});
  want.insert(want.end(), h_b.begin(), h_b.end());
  expect_close(hidden_of(model, ctx, use_merged), want, tol, "kUse parts");
  expect_same_cache(merged_a, alone_a, c.n_layer, tol, "part a after kUse");
  expect_same_cache(merged_b, alone_b, c.n_layer, tol, "part b after kUse");
}

// Row b of a canvas as a canvas of its own (its padding and positions kept).
BatchCase row_of(const BatchCase& k, int64_t b) {
  BatchCase r;
  r.B = 1, r.L = k.L;
  const auto row = [&](const auto& v) { return std::vector(v.begin() + b * k.L, v.begin() + (b + 1) * k.L); };
  r.tokens = row(k.tokens);
  if (!k.valid.empty()) r.valid = row(k.valid), r.positions = row(k.positions);
  return r;
}

TEST(KvCache, RowsWithTheirOwnPositionsEachComputeAsAlone) {
  // A list per row (window_row_begin, cache committed in a batch): over steps whose tokens change, each row's
  // hidden rows and cache row equal that row's own forward (B = 1, its list the one list) bit for bit with the
  // reference kernels, also when the other row computes nothing and as a part after another. With 2+ layers a
  // row that also computed the other row's positions (their union) would refresh those K/V and differ.
  ThreadPool pool(2);
  Context ctx{Device::kCpu, &pool};
  ctx.reference_kernels = true;
  struct Step {
    std::vector<int64_t> at[2], changed[2];  // per row: the positions computed, those whose token changes first
  };
  const std::vector<Step> steps = {{{{4, 6, 7, 10}, {5, 11}}, {{6, 7}, {5}}},
                                   {{{}, {3, 4, 5}}, {{}, {4}}},
                                   {{{5, 8}, {5, 11}}, {{8}, {11}}}};
  int m = 0;
  for (const auto& model : fixture_models()) {
    const ModelConfig& c = model->config();
    ++m;
    BatchCase k = make_canvas(c, 2, 12, 7);  // row 1: 3 left pads
    BatchCase alone[2] = {row_of(k, 0), row_of(k, 1)};
    KvCache cache, own[2];
    const std::vector<int64_t> all = window_rows(k, 0, k.L);
    hidden_of(*model, ctx, std::vector{k.view(all, CacheOp::kRefresh, &cache)});
    for (int64_t b = 0; b < 2; ++b) {
      const std::vector<int64_t> own_rows = window_rows(alone[b], 0, k.L);
      hidden_of(*model, ctx, std::vector{alone[b].view(own_rows, CacheOp::kRefresh, &own[b])});
    }
    for (size_t s = 0; s < steps.size(); ++s) {
      std::vector<int64_t> at, row_begin = {0};
      std::vector<float> want;
      for (int64_t b = 0; b < 2; ++b) {
        for (int64_t i : steps[s].changed[b])
          alone[b].tokens[i] = k.tokens[b * k.L + i] = static_cast<int32_t>((k.tokens[b * k.L + i] + 37) % 300);
        at.insert(at.end(), steps[s].at[b].begin(), steps[s].at[b].end());
        row_begin.push_back(static_cast<int64_t>(at.size()));
        if (steps[s].at[b].empty()) continue;
        const std::vector<int64_t> rows = rows_at(alone[b], steps[s].at[b]);
        const std::vector<float> h = hidden_of(*model, ctx, std::vector{scattered_batch_of(alone[b], rows, &own[b], 2, -1, steps[s].at[b])});
        want.insert(want.end(), h.begin(), h.end());
      }
      std::vector<int64_t> rows;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t r : rows_at(alone[b], steps[s].at[b])) rows.push_back(b * k.L + r);
      ForwardBatch batch = scattered_batch_of(k, rows, &cache, 2, -1, at);
      batch.window_row_begin = row_begin.data();
      EXPECT_EQ(batch.n_computed(), static_cast<int64_t>(at.size()));
      const std::string what = "fixture " + std::to_string(m) + " step " + std::to_string(s);
      expect_close(hidden_of(*model, ctx, {&batch, 1}), want, 0.0, what);
      // Again as the second part of a forward over parts (a server's request after another): the same rows (the
      // repeated store writes the same K/V).
      const BatchCase u = make_canvas(c, 1, 9, 2);
      const std::vector<int64_t> rows_u = window_rows(u, 0, u.L);
      const ForwardBatch parts[] = {u.view(rows_u, CacheOp::kNone, nullptr), batch};
      std::vector<float> with_u = hidden_of(*model, ctx, {&parts[0], 1});
      with_u.insert(with_u.end(), want.begin(), want.end());
      expect_close(hidden_of(*model, ctx, parts), with_u, 0.0, what + ", after another part");
      const int64_t row_floats = k.L * cache.kv_dim();
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t il = 0; il < c.n_layer; ++il) {
          const auto row = [&](const float* at) { return std::vector<float>(at + b * row_floats, at + (b + 1) * row_floats); };
          const auto whole = [&](const float* at) { return std::vector<float>(at, at + row_floats); };
          expect_close(row(cache.k(il)), whole(own[b].k(il)), 0.0, what + " K row " + std::to_string(b));
          expect_close(row(cache.v(il)), whole(own[b].v(il)), 0.0, what + " V row " + std::to_string(b));
        }
    }
  }
}

TEST(KvCache, PartsInOneForwardGiveEachPartsOwnRowsAndCache) {
  ThreadPool pool(2);
  for (const auto& model : fixture_models())
    for (const bool reference : {true, false}) {
      Context ctx{Device::kCpu, &pool};
      ctx.reference_kernels = reference;
      expect_parts_equal_alone(*model, ctx, reference ? 0.0 : 1e-5);
    }
}

TEST(KvCache, BadPartsAreRejectedNamingThePart) {
  ThreadPool pool(2);
  const Context ctx{Device::kCpu, &pool};
  const auto models = fixture_models();
  ASSERT_FALSE(models.empty());
  const Model& model = *models[0];
  const BatchCase a = make_canvas(model.config(), 1, 8, 1);
  const std::vector<int64_t> rows = window_rows(a, 0, a.L);
  std::vector<float> hidden(rows.size() * 2 * static_cast<size_t>(model.config().n_embd));
  KvCache shared, empty;
  const ForwardBatch same_cache[] = {a.view(rows, CacheOp::kRefresh, &shared),
                                     a.view(rows, CacheOp::kRefresh, &shared)};
  Status s = model.forward_hidden_parts(ctx, same_cache, hidden.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("share a KV cache"), std::string::npos) << s.to_string();
  const std::vector<int64_t> window = window_rows(a, 2, 4);
  const ForwardBatch unfilled[] = {a.view(rows, CacheOp::kNone, nullptr), a.view(window, CacheOp::kUse, &empty, 2, 4)};
  s = model.forward_hidden_parts(ctx, unfilled, hidden.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("part 1"), std::string::npos) << s.to_string();
  EXPECT_EQ(model.forward_hidden_parts(ctx, {}, hidden.data()).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dc
