// Block decoding through the Engine (Fast-dLLM, spec §6): cache none against the PyTorch reference's
// block decoder (token-identical, every step's canvas and commit counts), the cached modes' refresh
// forwards against full passes (bit-identical), the prefix / dual drift from cache none on the tiny
// fixtures (printed, not asserted), and the KV-cache size limit. Cache committed: with refresh_every 1 it is
// dual token for token; on one layer it is exact; each row of a batch computes its own positions and gets the
// tokens of its own decoding; otherwise its agreement with dual is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "model/kv_cache.h"

namespace dc {
namespace {

using testing::load_exact;

SamplingParams block_params_of(const Engine& engine, const nlohmann::json& p) {
  SamplingParams s = testing::reference_params(engine, p);
  s.block_length = p["block_length"].get<int64_t>();
  s.threshold = p["threshold"].is_null() ? 0.0f : p["threshold"].get<float>();
  s.factor = p["factor"].is_null() ? 0.0f : p["factor"].get<float>();
  return s;
}

struct BlockCase {
  std::string model_dir, name;
  std::vector<std::vector<int32_t>> prompts;
  nlohmann::json json;
};

std::vector<BlockCase> block_cases() {
  std::vector<BlockCase> cases;
  const auto manifest = dc::testing::load_manifest();
  for (const auto& m : manifest["models"]) {
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    const auto doc = dc::testing::load_json(dir + "/reference/generate_block.json");
    for (const auto& c : doc["cases"])
      cases.push_back({dir, m["name"].get<std::string>() + "/" + c["name"].get<std::string>(),
                       c["prompts"].get<std::vector<std::vector<int32_t>>>(), c});
  }
  return cases;
}

TEST(BlockParity, CacheNoneIsTokenIdenticalToTheReferenceBlockDecoder) {
  int n_cases = 0, n_parallel = 0;
  for (const BlockCase& bc : block_cases()) {
    auto engine = load_exact(bc.model_dir, 2);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    SamplingParams params = block_params_of(**engine, bc.json["params"]);
    params.output_history = true;
    auto out = (*engine)->generate(bc.prompts, params);
    ASSERT_TRUE(out.ok()) << bc.name << ": " << out.status().to_string();
    EXPECT_EQ(out->sequences, bc.json["sequences"].get<std::vector<std::vector<int32_t>>>()) << bc.name;
    const auto history = bc.json["history"].get<std::vector<std::vector<std::vector<int32_t>>>>();
    const auto counts = bc.json["counts"].get<std::vector<std::vector<int64_t>>>();
    ASSERT_EQ(out->history.size(), history.size()) << bc.name << ": steps run";
    ASSERT_EQ(out->committed_counts.size(), counts.size()) << bc.name;
    for (size_t s = 0; s < history.size(); ++s) {
      std::vector<int32_t> want;
      for (const auto& row : history[s]) want.insert(want.end(), row.begin(), row.end());
      ASSERT_EQ(out->history[s], want) << bc.name << " canvas after step " << s;
      EXPECT_EQ(out->committed_counts[s], counts[s]) << bc.name << " step " << s;
    }
    ++n_cases;
    n_parallel += params.threshold > 0.0f || params.factor > 0.0f;
  }
  EXPECT_GE(n_cases, 25);
  EXPECT_GE(n_parallel, 12);
}

// Never commit the mask id (an approximate cache may make the tiny models predict it): no mask is left.
void suppress_mask(GenerateHooks& hooks, int32_t mask_id) {
  hooks.logits_hook = [mask_id](const LogitsHookArgs& a) {
    for (size_t r = 0; r < a.positions.size(); ++r)
      a.logits[r * static_cast<size_t>(a.n_vocab) + static_cast<size_t>(mask_id)] = -std::numeric_limits<float>::infinity();
  };
}

TEST(BlockParity, RefreshForwardsAreFullPassesBitForBit) {
  // Every forward of a cached run is checked against a plain full forward of the same canvas: kRefresh
  // must be bit-identical (that step IS a full pass); kUse differs by the approximation (printed).
  for (CacheMode mode : {CacheMode::kPrefix, CacheMode::kDual}) {
    int refreshes = 0, uses = 0;
    double worst_use = 0;
    for (const BlockCase& bc : block_cases()) {
      auto engine = load_exact(bc.model_dir, 2);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      Engine& e = **engine;
      SamplingParams params = block_params_of(e, bc.json["params"]);
      params.cache = mode;
      const Context ctx{Device::kCpu, &e.pool()};
      const int64_t V = e.config().n_vocab;
      const LogitsFn inner = e.logits_fn();
      std::vector<float> plain;
      const LogitsFn checked = [&](const ForwardBatch& batch, float* logits) -> Status {
        DC_RETURN_IF_ERROR(inner(batch, logits));
        ForwardBatch full = batch;
        full.cache_op = CacheOp::kNone;
        full.cache = nullptr;
        full.window_begin = 0;
        full.window_end = -1;
        plain.assign(static_cast<size_t>(batch.n_out * V), 0.0f);
        DC_RETURN_IF_ERROR(e.model().forward(ctx, full, plain.data()));
        if (batch.cache_op == CacheOp::kRefresh) {
          ++refreshes;
          for (size_t i = 0; i < plain.size(); ++i)
            if (logits[i] != plain[i]) {
              ADD_FAILURE() << bc.name << " " << cache_mode_name(mode) << ": refresh logit " << i << " = " << logits[i]
                            << ", full pass " << plain[i];
              break;
            }
        } else {
          EXPECT_EQ(batch.cache_op, CacheOp::kUse);
          ++uses;
          double diff = 0, ref = 1e-30;
          for (size_t i = 0; i < plain.size(); ++i) {
            diff = std::max(diff, static_cast<double>(std::abs(logits[i] - plain[i])));
            ref = std::max(ref, static_cast<double>(std::abs(plain[i])));
          }
          worst_use = std::max(worst_use, diff / ref);
        }
        return Status::ok_status();
      };
      GenerateHooks hooks;
      hooks.pool = &e.pool();
      suppress_mask(hooks, params.mask_token_id);
      auto out = generate(checked, e.config().n_vocab, bc.prompts, params, hooks);
      ASSERT_TRUE(out.ok()) << bc.name << ": " << out.status().to_string();
    }
    std::printf("  cache %s: %d refresh forwards bit-identical to full passes; %d cached forwards, worst "
                "max|Δlogit| / max|logit| %.3g\n",
                cache_mode_name(mode), refreshes, uses, worst_use);
    EXPECT_GT(refreshes, 0);
    EXPECT_GT(uses, 0);
  }
}

TEST(BlockParity, PrefixAndDualDriftFromCacheNone) {
  // Runs every reference block case with cache none, prefix and dual (mask id suppressed in all three):
  // generation must complete with no mask left, and every step up to the first forward (the first
  // block's refresh) must be identical; the fraction of generated tokens that differ is printed.
  struct Tally {
    int64_t tokens = 0, differ = 0, forwards = 0, positions = 0;
  };
  Tally none_tally, tally[2];
  for (const BlockCase& bc : block_cases()) {
    auto engine = load_exact(bc.model_dir, 2);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    Engine& e = **engine;
    SamplingParams params = block_params_of(e, bc.json["params"]);
    params.output_history = true;
    GenerateHooks hooks;
    suppress_mask(hooks, params.mask_token_id);
    auto none = e.generate(bc.prompts, params, hooks);
    ASSERT_TRUE(none.ok()) << bc.name << ": " << none.status().to_string();
    none_tally.forwards += none->timings.forwards;
    none_tally.positions += none->timings.positions_computed;
    size_t first_forward = 0;  // the first step that committed something ran the first forward
    while (first_forward < none->committed_counts.size()) {
      int64_t sum = 0;
      for (int64_t n : none->committed_counts[first_forward]) sum += n;
      if (sum > 0) break;
      ++first_forward;
    }
    for (int m = 0; m < 2; ++m) {
      params.cache = m == 0 ? CacheMode::kPrefix : CacheMode::kDual;
      auto cached = e.generate(bc.prompts, params, hooks);
      ASSERT_TRUE(cached.ok()) << bc.name << ": " << cached.status().to_string();
      for (size_t r = 0; r < cached->generated.size(); ++r)
        for (size_t i = 0; i < cached->generated[r].size(); ++i) {
          ASSERT_NE(cached->generated[r][i], params.mask_token_id) << bc.name << " row " << r << " position " << i;
          ++tally[m].tokens;
          tally[m].differ += cached->generated[r][i] != none->generated[r][i];
        }
      ASSERT_GT(cached->history.size(), first_forward);
      for (size_t s = 0; s <= first_forward; ++s)
        EXPECT_EQ(cached->history[s], none->history[s]) << bc.name << " " << cache_mode_name(params.cache) << " step " << s;
      EXPECT_GT(cached->timings.cache_refreshes, 0);
      tally[m].forwards += cached->timings.forwards;
      tally[m].positions += cached->timings.positions_computed;
    }
  }
  std::printf("  cache none: %ld forwards, %ld positions computed\n", static_cast<long>(none_tally.forwards),
              static_cast<long>(none_tally.positions));
  for (int m = 0; m < 2; ++m)
    std::printf("  cache %-6s: %ld of %ld generated tokens (%.1f%%) differ from cache none; %ld forwards, %ld "
                "positions computed (%.2fx fewer)\n",
                m == 0 ? "prefix" : "dual", static_cast<long>(tally[m].differ), static_cast<long>(tally[m].tokens),
                100.0 * static_cast<double>(tally[m].differ) / static_cast<double>(std::max<int64_t>(tally[m].tokens, 1)),
                static_cast<long>(tally[m].forwards), static_cast<long>(tally[m].positions),
                static_cast<double>(none_tally.positions) / static_cast<double>(std::max<int64_t>(tally[m].positions, 1)));
}

TEST(BlockParity, OneLayerModelsDecodeIdenticallyWithEveryCacheMode) {
  // With one layer a position's K/V depend only on its own token. During a block only the block's tokens
  // change, and the cached forwards recompute the block, so prefix and dual are exact: the generations
  // must equal cache none token for token (up to f32 rounding between the window and full attention).
  // This checks the cache plumbing end to end (refresh timing, windows, K/V placement, padding).
  int n_runs = 0;
  for (const BlockCase& bc : block_cases()) {
    auto loaded = Model::load(bc.model_dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    std::shared_ptr<const Model> base(std::move(*loaded));
    ModelConfig config = base->config();
    config.n_layer = 1;
    ModelWeights weights = base->weights();
    weights.layers.resize(1);
    std::unique_ptr<Engine> engine = Engine::from_model(Model::from_weights(config, std::move(weights), base), 2);
    SamplingParams params = block_params_of(*engine, bc.json["params"]);
    GenerateHooks hooks;
    suppress_mask(hooks, params.mask_token_id);
    auto none = engine->generate(bc.prompts, params, hooks);
    ASSERT_TRUE(none.ok()) << bc.name << ": " << none.status().to_string();
    // Cache committed too (never refreshing inside a block, and every 3rd forward): a committed position's
    // K/V, computed once after its commit, and a masked one's cannot change later on one layer.
    for (auto [mode, every] : {std::pair{CacheMode::kPrefix, 1}, {CacheMode::kDual, 1}, {CacheMode::kCommitted, 1000},
                               {CacheMode::kCommitted, 3}}) {
      params.cache = mode;
      params.refresh_every = every;
      auto cached = engine->generate(bc.prompts, params, hooks);
      ASSERT_TRUE(cached.ok()) << bc.name << ": " << cached.status().to_string();
      const std::string what = bc.name + " (1 layer), cache " + cache_mode_name(mode) + " refresh every " + std::to_string(every);
      EXPECT_EQ(cached->sequences, none->sequences) << what;
      EXPECT_EQ(cached->committed_counts, none->committed_counts) << what;
      ++n_runs;
    }
  }
  EXPECT_GE(n_runs, 100);
}

TEST(BlockParity, CommittedWithRefreshEveryOneIsDualTokenForToken) {
  // refresh_every 1: every forward after a block's refresh recomputes the whole block, as dual does.
  int n_cases = 0, n_padded = 0, n_parallel = 0;
  std::set<std::string> algs;
  for (const BlockCase& bc : block_cases()) {
    auto engine = load_exact(bc.model_dir, 2);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    SamplingParams params = block_params_of(**engine, bc.json["params"]);
    params.output_history = true;
    params.cache = CacheMode::kDual;
    auto dual = (*engine)->generate(bc.prompts, params);
    ASSERT_TRUE(dual.ok()) << bc.name << ": " << dual.status().to_string();
    params.cache = CacheMode::kCommitted;
    params.refresh_every = 1;
    auto committed = (*engine)->generate(bc.prompts, params);
    ASSERT_TRUE(committed.ok()) << bc.name << ": " << committed.status().to_string();
    EXPECT_EQ(committed->history, dual->history) << bc.name;
    EXPECT_EQ(committed->committed_counts, dual->committed_counts) << bc.name;
    EXPECT_EQ(committed->timings.positions_computed, dual->timings.positions_computed) << bc.name;
    ++n_cases;
    n_padded += std::any_of(bc.prompts.begin(), bc.prompts.end(),
                            [&](const auto& p) { return p.size() != bc.prompts[0].size(); });
    n_parallel += parallel_decoding(params);
    algs.insert(algorithm_name(params.alg));
  }
  EXPECT_GE(n_cases, 25);
  EXPECT_GE(n_padded, 1);
  EXPECT_GE(n_parallel, 12);
  EXPECT_GE(algs.size(), 3u);
}

TEST(BlockParity, CommittedComputesTheMaskedAndNewlyCommittedRowsAndDriftsFromDual) {
  // Every forward of a committed run between refreshes computes exactly the rule's positions in each row
  // (checked here against the canvas: masked, committed since the forward before, j − 1 of a masked j; none in a
  // row with no mask in the window), their sum over the rows and fewer than dual's window; the generated tokens'
  // agreement with dual is printed (the tiny random fixtures: a lower bound).
  for (int every : {2, 4, 1000}) {
    int64_t tokens = 0, same = 0, positions = 0, dual_positions = 0, scattered = 0, per_row = 0;
    for (const BlockCase& bc : block_cases()) {
      auto engine = load_exact(bc.model_dir, 2);
      ASSERT_TRUE(engine.ok()) << engine.status().to_string();
      Engine& e = **engine;
      SamplingParams params = block_params_of(e, bc.json["params"]);
      GenerateHooks hooks;
      suppress_mask(hooks, params.mask_token_id);
      params.cache = CacheMode::kDual;
      auto dual = e.generate(bc.prompts, params, hooks);
      ASSERT_TRUE(dual.ok()) << bc.name << ": " << dual.status().to_string();
      params.cache = CacheMode::kCommitted;
      params.refresh_every = every;
      const LogitsFn inner = e.logits_fn();
      std::vector<int32_t> previous;  // the canvas of the previous forward
      const LogitsFn checked = [&](const ForwardBatch& batch, float* logits) -> Status {
        if (batch.window_positions != nullptr) {
          ++scattered;
          const int64_t width = batch.window_stop() - batch.window_begin;
          int64_t sum = 0;  // of the rows' own sets
          for (int64_t b = 0; b < batch.n_batch; ++b) {
            const int64_t at = b * batch.n_seq;
            auto masked = [&](int64_t j) { return j < batch.window_stop() && batch.tokens[at + j] == params.mask_token_id; };
            std::vector<int64_t> want;  // none in a row without a masked position in the window
            for (int64_t i = batch.window_begin; i < batch.window_stop(); ++i)
              if (masked(i) || masked(i + 1) || batch.tokens[at + i] != previous[static_cast<size_t>(at + i)]) want.push_back(i);
            if (std::none_of(want.begin(), want.end(), masked)) want.clear();
            EXPECT_EQ(std::vector<int64_t>(batch.row_positions(b), batch.row_positions(b) + batch.row_width(b)), want)
                << bc.name << " row " << b;
            sum += static_cast<int64_t>(want.size());
          }
          per_row += batch.window_row_begin != nullptr;
          EXPECT_EQ(batch.n_computed(), sum) << bc.name;
          EXPECT_LT(sum, batch.n_batch * width) << bc.name;
        }
        previous.assign(batch.tokens, batch.tokens + batch.n_batch * batch.n_seq);
        return inner(batch, logits);
      };
      hooks.pool = &e.pool();
      auto committed = generate(checked, e.config().n_vocab, bc.prompts, params, hooks);
      ASSERT_TRUE(committed.ok()) << bc.name << ": " << committed.status().to_string();
      for (size_t r = 0; r < committed->generated.size(); ++r)
        for (size_t i = 0; i < committed->generated[r].size(); ++i) {
          ASSERT_NE(committed->generated[r][i], params.mask_token_id) << bc.name << " row " << r << " position " << i;
          ++tokens;
          same += committed->generated[r][i] == dual->generated[r][i];
        }
      positions += committed->timings.positions_computed;
      dual_positions += dual->timings.positions_computed;
    }
    std::printf("  cache committed, refresh every %4d: %ld of %ld generated tokens (%.1f%%) agree with dual; %ld "
                "positions computed against dual's %ld (%.2fx fewer)\n",
                every, static_cast<long>(same), static_cast<long>(tokens), 100.0 * static_cast<double>(same) / static_cast<double>(tokens),
                static_cast<long>(positions), static_cast<long>(dual_positions),
                static_cast<double>(dual_positions) / static_cast<double>(positions));
    EXPECT_GT(scattered, 0);
    EXPECT_GT(per_row, 0);  // batches whose rows computed lists of their own
    EXPECT_LT(positions, dual_positions) << "refresh every " << every;
  }
}

TEST(BlockParity, CommittedGivesEachRowOfABatchTheTokensOfItsOwnDecoding) {
  // Prompts of different lengths (left-padded) in one batch, threshold decoding (each row commits its own
  // positions: their masked sets differ), f32 with the reference kernels (row-wise arithmetic): each row's
  // generated tokens equal its prompt decoded alone with cache committed, whose positions are each row's own.
  // Without a whole-window step inside a block the batch's positions computed are the rows' own sums: those
  // of the rows alone, once the refreshes (rows × canvas each) are taken out.
  const std::vector<std::vector<int32_t>> prompts = {{5, 9, 2, 7, 3}, {8, 1}, {4, 4, 6, 10}, {11, 3, 3, 12, 7}};
  const auto manifest = dc::testing::load_manifest();
  int64_t per_row = 0;
  for (const auto& m : manifest["models"]) {
    auto loaded = Model::load(dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>());
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    const Model& model = **loaded;
    ThreadPool pool(2);
    Context ctx{Device::kCpu, &pool};
    ctx.reference_kernels = true;  // (MatmulPrecision::kF32, the default)
    SamplingParams p;
    p.mask_token_id = static_cast<int32_t>(model.config().mask_token_id);
    p.pad_token_id = static_cast<int32_t>(model.config().pad_token_id);
    p.max_new_tokens = 16;
    p.block_length = 8;
    p.threshold = 0.2f;
    p.temperature = 0.0f;
    p.cache = CacheMode::kCommitted;
    GenerateHooks hooks;
    suppress_mask(hooks, p.mask_token_id);
    hooks.on_forward = [&](const ForwardBatch& b, double) { per_row += b.window_row_begin != nullptr; };
    for (int every : {4, 1000}) {
      p.refresh_every = every;
      auto batch = generate_on_model(model, ctx, int64_t{1} << 30, prompts, p, hooks);
      ASSERT_TRUE(batch.ok()) << batch.status().to_string();
      int64_t own_sum = 0;
      for (size_t r = 0; r < prompts.size(); ++r) {
        auto alone = generate_on_model(model, ctx, int64_t{1} << 30, {prompts[r]}, p, hooks);
        ASSERT_TRUE(alone.ok()) << alone.status().to_string();
        EXPECT_EQ(batch->generated[r], alone->generated[0]) << m["name"] << " row " << r << ", refresh every " << every;
        own_sum += alone->timings.positions_computed - alone->timings.cache_refreshes * alone->n_seq;
      }
      if (every == 1000) {
        EXPECT_EQ(batch->timings.positions_computed - batch->timings.cache_refreshes * batch->n_rows * batch->n_seq, own_sum)
            << m["name"];
      }
    }
  }
  EXPECT_GT(per_row, 0);  // forwards whose rows computed lists of their own
}

TEST(BlockParity, KvCacheLargerThanTheLimitIsRefused) {
  const auto manifest = dc::testing::load_manifest();
  ASSERT_FALSE(manifest["models"].empty());
  EngineOptions options;
  options.model_dir = dc::testing::fixtures_dir() + "/" + manifest["models"][0]["dir"].get<std::string>();
  options.n_threads = 1;
  options.max_kv_cache_bytes = 1000;
  auto engine = Engine::load(options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  SamplingParams p = (*engine)->default_params();
  p.max_new_tokens = 8;
  p.steps = 8;
  p.block_length = 4;
  p.alg = Algorithm::kEntropy;
  p.temperature = 0.0f;
  ASSERT_TRUE((*engine)->generate({{1, 2, 3}}, p).ok());  // cache none needs no cache
  p.cache = CacheMode::kDual;
  auto out = (*engine)->generate({{1, 2, 3}}, p);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(out.status().message().find("max_kv_cache_bytes"), std::string::npos) << out.status().message();
  // The same limit holds for a logits_fn() driven directly (e.g. by the benchmark).
  auto direct = generate((*engine)->logits_fn(), (*engine)->config().n_vocab, {{1, 2, 3}}, p);
  ASSERT_FALSE(direct.ok());
  EXPECT_NE(direct.status().message().find("KV cache"), std::string::npos) << direct.status().message();
  const ModelConfig& c = (*engine)->config();
  EXPECT_EQ((*engine)->kv_cache_bytes(2, 10), 2 * c.n_layer * 2 * 10 * c.n_head_kv * c.head_dim * 4);
}

}  // namespace
}  // namespace dc
