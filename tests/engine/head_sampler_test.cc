// Issue 20: the CPU HeadSampler (forward to hidden rows, then the lm_head and the sampling chunk by
// chunk) against the full path (the whole [n_out, n_vocab] logits of Model::forward) on the fixture
// models, at both matmul precisions (bf16 goes through the fast kernels whose summation order depends on
// a product's row count): the same tokens bit for bit, with steps of more rows than a chunk; several requests'
// parts sampled in one pass (sample_parts) as each alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "batch_case.h"
#include "engine/engine.h"
#include "engine/head_sampler.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "head_sampling_check.h"

namespace dc {
namespace {

// The full path with the lm_head in chunks of `chunk` rows: one [n_out, n_vocab] buffer per step.
LogitsFn full_logits(const Model& model, const Context& ctx, int64_t chunk) {
  auto hidden = std::make_shared<std::vector<float>>();
  return [&model, ctx, chunk, hidden](const ForwardBatch& batch, float* logits) -> Status {
    hidden->resize(static_cast<size_t>(batch.n_out * model.config().n_embd));
    DC_RETURN_IF_ERROR(model.forward_hidden(ctx, batch, hidden->data()));
    model.lm_head(ctx, hidden->data(), batch.n_out, logits, chunk);
    return Status::ok_status();
  };
}

HeadFn chunked(const Model& model, const Context& ctx, int64_t chunk) {
  auto head = std::make_shared<CpuHeadSampler>(model, ctx, chunk);
  return [head](const ForwardBatch& batch) -> Result<HeadSampler*> {
    DC_RETURN_IF_ERROR(head->forward(batch));
    return static_cast<HeadSampler*>(head.get());
  };
}

std::vector<SamplingParams> cases(const Engine& e) {
  std::vector<SamplingParams> out;
  const Algorithm algs[] = {Algorithm::kOrigin, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy};
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = 70;  // the first step samples 70 rows: more than a 64-row chunk
    p.steps = 3;
    p.alg = algs[i];
    p.temperature = i % 2 == 0 ? 0.8f : 0.0f;
    p.top_p = i == 2 ? 0.9f : 1.0f;
    p.seed = static_cast<uint64_t>(i);
    out.push_back(p);
  }
  return out;
}

TEST(CpuHeadSampler, ChunkedEqualsFullLogitsAtEveryChunkSize) {
  const auto manifest = dc::testing::load_manifest();
  for (const char* name : {"tiny-gqa4-bf16", "tiny-gqa2"}) {
    auto engine = testing::load_engine(dc::testing::fixtures_dir() + "/" + name, 2);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    Engine& e = **engine;
    Context ctx;
    ctx.pool = &e.pool();
    ctx.matmul_precision = e.matmul_precision();
    const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {8, 9}};
    for (const SamplingParams& p : cases(e)) {
      // The default: Engine::generate against the engine's own full path (Model::forward).
      auto by_engine = e.generate(prompts, p);
      GenerateHooks hooks;
      hooks.pool = &e.pool();
      auto by_full = generate(e.logits_fn(), e.config().n_vocab, prompts, p, hooks);
      ASSERT_TRUE(by_engine.ok() && by_full.ok()) << by_engine.status().to_string();
      EXPECT_EQ(by_engine->sequences, by_full->sequences) << name << " " << algorithm_name(p.alg);
      EXPECT_EQ(by_engine->committed_counts, by_full->committed_counts) << name << " " << algorithm_name(p.alg);
      for (int64_t chunk : {1, 7, 48}) {  // 70 and 140 rows: none of them divides
        // A policy (the reference's top-k rule) that records every confidence, compared bit for bit.
        std::vector<float> seen[2];
        auto hooks_of = [&](int path) {
          GenerateHooks h;
          h.unmask_policy = [&seen, path](const PolicyInput& in) {
            seen[path].insert(seen[path].end(), in.confidences.begin(), in.confidences.end());
            std::vector<int64_t> order(in.masked_positions.size());
            for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int64_t>(j);
            std::stable_sort(order.begin(), order.end(),
                             [&](int64_t a, int64_t b) { return in.confidences[a] > in.confidences[b]; });
            std::vector<int64_t> chosen;
            for (int64_t j = 0; j < in.k; ++j) chosen.push_back(in.masked_positions[order[j]]);
            return chosen;
          };
          return h;
        };
        auto got = generate(chunked(e.model(), ctx, chunk), e.config().n_vocab, prompts, p, hooks_of(0));
        auto want = generate(full_logits(e.model(), ctx, chunk), e.config().n_vocab, prompts, p, hooks_of(1));
        ASSERT_TRUE(got.ok() && want.ok()) << got.status().to_string() << want.status().to_string();
        EXPECT_EQ(got->sequences, want->sequences) << name << " " << algorithm_name(p.alg) << " chunk " << chunk;
        EXPECT_EQ(seen[0], seen[1]) << name << " " << algorithm_name(p.alg) << " chunk " << chunk;
        EXPECT_GT(seen[0].size(), 140u);
      }
    }
  }
}

// The chunked path's memory: sampling 140 rows of the 152k vocabulary holds one 64-row block of logits
// (plus the tiny model's activations), not 140 rows; logits() of a row equals forward()'s.
TEST(CpuHeadSampler, HoldsOneChunkOfLogits) {
  auto engine = testing::load_engine(dc::testing::fixtures_dir() + "/tiny-vocab", 2);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  const int64_t V = e.config().n_vocab, n_seq = 70;
  const HeadMemory m = e.head_memory();
  EXPECT_EQ(m.fixed_bytes, Model::kHeadChunkRows * V * 4);
  EXPECT_LT(m.bytes_per_row, V * 4 / 100);  // a hidden row, not a vocabulary row
  const BatchCase canvas = every_position(2, n_seq, [](int64_t i) { return i * 37 % 1000; });
  const ForwardBatch batch = canvas.view();
  Context ctx;
  ctx.pool = &e.pool();
  ctx.matmul_precision = e.matmul_precision();
  CpuHeadSampler head(e.model(), ctx);
  ASSERT_TRUE(head.forward(batch).ok());
  std::vector<HeadRow> rows;
  for (int64_t r = 0; r < batch.n_out; ++r) rows.push_back({r, r / n_seq, r % n_seq});
  std::vector<TokenSample> samples(rows.size());
  HeadSampling args{FilterConfig{0.0f, 1.0f, 0}, ConfidenceKind::kProbability, 1, 0, rows};
  ASSERT_TRUE(head.sample(args, samples).ok());
  EXPECT_GE(head.workspace_bytes(), Model::kHeadChunkRows * V * 4);
  EXPECT_LT(head.workspace_bytes(), 100 * V * 4) << "more than a chunk of logit rows held";
  // The greedy token of row 100 is the argmax of forward()'s logits row 100.
  std::vector<float> logits(static_cast<size_t>(batch.n_out * V));
  ASSERT_TRUE(e.model().forward(ctx, batch, logits.data()).ok());
  const float* row = logits.data() + 100 * V;
  EXPECT_EQ(samples[100].token, std::max_element(row, row + V) - row);
  // Rows [64, 140) from row 64: the same chunks as forward()'s, the same logits bit for bit.
  std::vector<float> tail(static_cast<size_t>(76 * V));
  ASSERT_TRUE(head.logits(64, 76, tail.data()).ok());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), logits.begin() + 64 * V));
  // release() hands every buffer back; the next forward grows them again and samples the same.
  head.release();
  EXPECT_EQ(head.workspace_bytes(), 0);
  EXPECT_EQ(head.n_rows(), 0);
  ASSERT_TRUE(head.forward(batch).ok());
  std::vector<TokenSample> again(rows.size());
  ASSERT_TRUE(head.sample(args, again).ok());
  EXPECT_EQ(again[100].token, samples[100].token);
}

// A merged step (HeadSampler::sample_parts): several requests' parts, each with its own filters, confidence
// kind, seed and step, sampled in one pass over chunks that straddle the parts (7 rows: parts of 12, 0, 19 and
// 7 rows, one with two positions on one row) give each part exactly what sample() gives it alone (the
// reference kernels: a row's logits do not depend on its chunk), tokens and confidences bit for bit.
TEST(CpuHeadSampler, SamplePartsEqualsEachPartAlone) {
  auto engine = testing::load_engine(dc::testing::fixtures_dir() + "/tiny-gqa2", 2);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  Engine& e = **engine;
  const int64_t n_seq = 20;
  const BatchCase canvas = every_position(2, n_seq, [](int64_t i) { return (i * 53 + 7) % 200 + 1; });
  const ForwardBatch batch = canvas.view();
  Context ctx;
  ctx.pool = &e.pool();
  ctx.reference_kernels = true;
  CpuHeadSampler head(e.model(), ctx, 7);
  ASSERT_TRUE(head.forward(batch).ok());
  const auto rows_of = [&](int64_t first, int64_t last) {
    std::vector<HeadRow> rows;
    for (int64_t r = first; r < last; ++r) {
      rows.push_back({r, r / n_seq, r % n_seq + 1});
      if (r == first + 3) rows.push_back({r, r / n_seq, r % n_seq + 2});  // two positions on one row
    }
    return rows;
  };
  const std::vector<HeadRow> a = rows_of(0, 11), none, c = rows_of(12, 30), d = rows_of(33, 40);
  const std::vector<HeadSampling> parts = {
      {FilterConfig{0.0f, 1.0f, 5}, ConfidenceKind::kMargin, 1, 2, a},
      {FilterConfig{0.5f, 1.0f, 0}, ConfidenceKind::kProbability, 2, 2, none},
      {FilterConfig{0.8f, 0.9f, 0}, ConfidenceKind::kNegEntropy, 7, 5, c},
      {FilterConfig{1.0f, 1.0f, 20}, ConfidenceKind::kProbability, 3, 0, d}};
  std::vector<TokenSample> merged(a.size() + c.size() + d.size());
  std::vector<Status> status(parts.size(), internal_error("not written"));
  ASSERT_TRUE(head.sample_parts(parts, merged, status).ok());
  testing::expect_parts_equal_alone(head, parts, merged, status);
  // The temperature draws differ from a greedy part's: the parts kept their own settings.
  std::vector<TokenSample> greedy(c.size());
  ASSERT_TRUE(head.sample({FilterConfig{0.0f, 1.0f, 0}, ConfidenceKind::kNegEntropy, 7, 5, c}, greedy).ok());
  bool differs = false;
  for (size_t e = 0; e < c.size(); ++e) differs |= greedy[e].token != merged[a.size() + e].token;
  EXPECT_TRUE(differs) << "part 2 sampled as if greedy";
}

}  // namespace
}  // namespace dc
