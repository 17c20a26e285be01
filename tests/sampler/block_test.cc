// Block decoding, KV-cache forwards and threshold / factor decoding in generate() (Fast-dLLM, spec §6)
// with fake models: the block plan and schedule, candidates restricted to the block, the cache ops and
// windows asked of the model, the parallel-decoding rules on crafted confidences, rows that finish a
// block early, cache committed's rows per step, and parameter validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "sampler/fake_model.h"
#include "sampler/generate.h"

namespace dc {
namespace {

using testing::FakeModel;
using testing::RecordedBatch;

using testing::kMask;
using testing::kPad;
using testing::kVocab;
constexpr int32_t kToken = 5;

SamplingParams block_params(int64_t new_tokens, int steps, int64_t block_length) {
  SamplingParams p;
  p.max_new_tokens = new_tokens;
  p.steps = steps;
  p.block_length = block_length;
  p.mask_token_id = kMask;
  p.pad_token_id = kPad;
  p.alg = Algorithm::kEntropy;
  p.temperature = 0.0f;
  return p;
}

// Logits whose softmax gives probability `c` to kToken and spreads the rest evenly.
void logits_with_confidence(float c, float* logits) {
  const float rest = std::log((1.0f - c) / static_cast<float>(kVocab - 1));
  std::fill(logits, logits + kVocab, rest);
  logits[kToken] = std::log(c);
}

// Position j (sampled from row j − 1) gets confidence conf(b, j).
testing::RowFn confidence_model(std::function<float(int64_t b, int64_t j)> conf) {
  return [conf](const ForwardBatch&, int64_t b, int64_t i, float* logits) { logits_with_confidence(conf(b, i + 1), logits); };
}

std::vector<int64_t> row_counts(const GenerateOutput& out, int64_t row) {
  std::vector<int64_t> v;
  for (const auto& step : out.committed_counts) v.push_back(step[static_cast<size_t>(row)]);
  return v;
}

TEST(BlockDecoding, ScheduleRunsPerBlock) {
  // 16 new tokens in blocks of 8 with 16 steps: the reference schedule of 8 tokens / 8 steps twice.
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t) { return 0.5f; }));
  std::vector<int> blocks;
  GenerateHooks hooks;
  hooks.on_step = [&](const StepInfo& s) {
    blocks.push_back(s.block);
    EXPECT_EQ(s.n_blocks, 2);
    EXPECT_EQ(s.n_steps, 16);
    return true;
  };
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, block_params(16, 16, 8), hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(row_counts(*out, 0), (std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 2, 0, 1, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(blocks, (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(out->generated[0], std::vector<int32_t>(16, kToken));
  EXPECT_EQ(model.batches().size(), 14u);  // step 0 of each block commits nothing: no forward
  EXPECT_EQ(out->timings.forwards, 14);
}

TEST(BlockDecoding, UnevenBlocksAndSteps) {
  // 16 new tokens in blocks of 5 → 5, 5, 5, 1; 7 steps → 2, 2, 2, 1 (the first 7 mod 4 blocks get one more).
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t) { return 0.5f; }));
  std::vector<int> blocks;
  GenerateHooks hooks;
  hooks.on_step = [&](const StepInfo& s) {
    blocks.push_back(s.block);
    return true;
  };
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, block_params(16, 7, 5), hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(row_counts(*out, 0), (std::vector<int64_t>{2, 3, 2, 3, 2, 3, 1}));
  EXPECT_EQ(blocks, (std::vector<int>{0, 0, 1, 1, 2, 2, 3}));

  // Fewer steps than blocks is an error that names steps.
  Result<GenerateOutput> bad = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, block_params(16, 3, 5));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("steps"), std::string::npos) << bad.status().message();
}

TEST(BlockDecoding, OnlyTheCurrentBlockIsDecoded) {
  // Later positions are more confident: whole-canvas decoding starts at the right end, blocks do not.
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t j) { return 0.2f + 0.03f * static_cast<float>(j); }));
  const int64_t P = 2, BL = 4;
  GenerateHooks hooks;
  std::vector<int64_t> order;
  hooks.on_step = [&](const StepInfo& s) {
    for (const MaskedPosition& mp : s.committed) {
      EXPECT_GE(mp.position, P + s.block * BL) << "step " << s.step;
      EXPECT_LT(mp.position, P + (s.block + 1) * BL) << "step " << s.step;
      order.push_back(mp.position);
    }
    return true;
  };
  SamplingParams p = block_params(12, 12, BL);
  p.threshold = 2.0f;  // never met: one position per step, the most confident of the block
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}}, p, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(order, (std::vector<int64_t>{5, 4, 3, 2, 9, 8, 7, 6, 13, 12, 11, 10}));
}

TEST(BlockDecoding, CacheOpsAndWindows) {
  // 8 new tokens after a prompt of 3, blocks of 4, 2 steps per block: each block runs two forwards.
  const int64_t n_seq = 11;
  auto run = [&](CacheMode mode, int64_t block_length) {
    FakeModel model(kVocab, confidence_model([](int64_t, int64_t j) { return 0.3f + 0.01f * static_cast<float>(j); }));
    SamplingParams p = block_params(8, 4, block_length);
    p.cache = mode;
    Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, p);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    for (const RecordedBatch& b : model.batches())
      for (int64_t row : b.out_rows) {
        EXPECT_GE(row % n_seq, b.window_begin) << cache_mode_name(mode);
        EXPECT_LT(row % n_seq, b.window_end) << cache_mode_name(mode);
      }
    return std::make_pair(model.batches(), *out);
  };
  struct Want {
    CacheOp op;
    int64_t begin, end;
  };
  auto expect_ops = [](const std::vector<RecordedBatch>& got, const std::vector<Want>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].cache_op, want[i].op) << what << " forward " << i;
      EXPECT_EQ(got[i].window_begin, want[i].begin) << what << " forward " << i;
      EXPECT_EQ(got[i].window_end, want[i].end) << what << " forward " << i;
    }
  };
  const auto none = run(CacheMode::kNone, 4);
  const auto prefix = run(CacheMode::kPrefix, 4);
  const auto dual = run(CacheMode::kDual, 4);
  expect_ops(none.first, {{CacheOp::kNone, 0, 11}, {CacheOp::kNone, 0, 11}, {CacheOp::kNone, 0, 11}, {CacheOp::kNone, 0, 11}},
             "none");
  // The window starts one position before the block: position j is sampled from row j − 1.
  expect_ops(prefix.first,
             {{CacheOp::kRefresh, 0, 11}, {CacheOp::kUse, 2, 11}, {CacheOp::kRefresh, 0, 11}, {CacheOp::kUse, 6, 11}},
             "prefix");
  expect_ops(dual.first,
             {{CacheOp::kRefresh, 0, 11}, {CacheOp::kUse, 2, 7}, {CacheOp::kRefresh, 0, 11}, {CacheOp::kUse, 6, 11}},
             "dual");
  // The fake computes exact logits whatever the op: the same tokens in every mode.
  EXPECT_EQ(prefix.second.sequences, none.second.sequences);
  EXPECT_EQ(dual.second.sequences, none.second.sequences);
  EXPECT_EQ(dual.second.timings.forwards, 4);
  EXPECT_EQ(dual.second.timings.cache_refreshes, 2);
  EXPECT_EQ(dual.second.timings.positions_computed, 11 + 5 + 11 + 5);
  EXPECT_EQ(none.second.timings.cache_refreshes, 0);

  // block_length 0 with a cache: one block of all new tokens.
  const auto whole = run(CacheMode::kPrefix, 0);
  ASSERT_GE(whole.first.size(), 2u);
  EXPECT_EQ(whole.first[0].cache_op, CacheOp::kRefresh);
  for (size_t i = 1; i < whole.first.size(); ++i) {
    EXPECT_EQ(whole.first[i].cache_op, CacheOp::kUse);
    EXPECT_EQ(whole.first[i].window_begin, 2);
  }
}

TEST(BlockDecoding, CommittedCacheComputesTheMaskedAndNewlyCommittedPositions) {
  // Prompt of 3, one block of 8 (positions 3..10), 8 steps: step 0 commits nothing (no forward), steps 1-6
  // one position each, left to right (confidence falls with the position), step 7 the last two. With
  // refresh_every 3 the block's forwards f = 0 (refresh), 3, 6 compute everything / the dual window; the
  // others the masked positions, the one committed since the last forward, and j − 1 of each masked j.
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t j) { return 0.9f - 0.01f * static_cast<float>(j); }));
  SamplingParams p = block_params(8, 8, 8);
  p.cache = CacheMode::kCommitted;
  p.refresh_every = 3;
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const std::vector<RecordedBatch>& got = model.batches();
  ASSERT_EQ(got.size(), 7u);
  const std::vector<std::vector<int64_t>> want = {
      {}, {3, 4, 5, 6, 7, 8, 9, 10}, {4, 5, 6, 7, 8, 9, 10}, {}, {6, 7, 8, 9, 10}, {7, 8, 9, 10}, {}};
  for (size_t f = 0; f < got.size(); ++f) {
    EXPECT_EQ(got[f].cache_op, f == 0 ? CacheOp::kRefresh : CacheOp::kUse) << "forward " << f;
    EXPECT_EQ(got[f].window_positions, want[f]) << "forward " << f;
    if (f > 0) EXPECT_EQ(got[f].window_begin, 2) << "forward " << f;
    for (int64_t row : got[f].out_rows) {
      if (!want[f].empty()) EXPECT_TRUE(std::binary_search(want[f].begin(), want[f].end(), row)) << "forward " << f;
    }
  }
  // 11 (refresh) + 8 + 7 + 9 (dual window [2, 11)) + 5 + 4 + 9.
  EXPECT_EQ(out->timings.positions_computed, 11 + 8 + 7 + 9 + 5 + 4 + 9);
  // The fake's logits are exact whatever it computes: the same tokens as dual.
  p.cache = CacheMode::kDual;
  FakeModel dual_model(kVocab, confidence_model([](int64_t, int64_t j) { return 0.9f - 0.01f * static_cast<float>(j); }));
  Result<GenerateOutput> dual = generate(dual_model.logits_fn(), kVocab, {{1, 2, 3}}, p);
  ASSERT_TRUE(dual.ok());
  EXPECT_EQ(out->sequences, dual->sequences);
}

TEST(BlockDecoding, CommittedCacheComputesEachRowsOwnPositions) {
  // Two rows, prompt of 3, one block of 8 (positions 3..10), 8 steps, never a whole-window step inside the block:
  // row 0 commits left to right, row 1 right to left, one position a step each (the last step two). Each row
  // computes its own positions (masked, committed since the forward before, j − 1 of a masked j); row 1's
  // first list is the whole window [2, 11), row 0's is [3, 11); one list for both rows would be their union.
  FakeModel model(kVocab, confidence_model([](int64_t b, int64_t j) {
    return 0.5f + (b == 0 ? -0.01f : 0.01f) * static_cast<float>(j);
  }));
  SamplingParams p = block_params(8, 8, 8);
  p.cache = CacheMode::kCommitted;
  p.refresh_every = 1000;
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}, {1, 2, 3}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const std::vector<RecordedBatch>& got = model.batches();
  ASSERT_EQ(got.size(), 7u);
  auto range = [](int64_t a, int64_t b) {
    std::vector<int64_t> v;
    for (int64_t i = a; i < b; ++i) v.push_back(i);
    return v;
  };
  int64_t computed = 2 * 11;  // the refresh: both rows' 11 positions
  for (size_t f = 1; f < got.size(); ++f) {
    const int64_t n = static_cast<int64_t>(f);
    const std::vector<int64_t> row0 = range(2 + n, 11), row1 = range(2, 12 - n);  // f = 1: [3, 11) and [2, 11)
    std::vector<int64_t> both = row0;
    both.insert(both.end(), row1.begin(), row1.end());
    EXPECT_EQ(got[f].cache_op, CacheOp::kUse) << "forward " << f;
    EXPECT_EQ(got[f].window_positions, both) << "forward " << f;
    EXPECT_EQ(got[f].window_row_begin, (std::vector<int64_t>{0, 9 - n, 19 - 2 * n})) << "forward " << f;
    for (int64_t row : got[f].out_rows) {  // each out row one of its own row's positions
      const std::vector<int64_t>& own = row / 11 == 0 ? row0 : row1;
      EXPECT_TRUE(std::binary_search(own.begin(), own.end(), row % 11)) << "forward " << f << " out row " << row;
    }
    computed += static_cast<int64_t>(both.size());
  }
  EXPECT_EQ(out->timings.positions_computed, computed);  // the rows' own lists summed, per forward
  // The fake's logits are exact whatever it computes: the same tokens as dual.
  p.cache = CacheMode::kDual;
  FakeModel dual_model(kVocab, confidence_model([](int64_t b, int64_t j) {
    return 0.5f + (b == 0 ? -0.01f : 0.01f) * static_cast<float>(j);
  }));
  Result<GenerateOutput> dual = generate(dual_model.logits_fn(), kVocab, {{1, 2, 3}, {1, 2, 3}}, p);
  ASSERT_TRUE(dual.ok());
  EXPECT_EQ(out->sequences, dual->sequences);
}

TEST(BlockDecoding, RefreshMovesToTheFirstStepThatRunsAForward) {
  // 16 / 16 steps in blocks of 8: step 0 of a block commits nothing and runs no forward.
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t) { return 0.5f; }));
  SamplingParams p = block_params(16, 16, 8);
  p.cache = CacheMode::kDual;
  ASSERT_TRUE(generate(model.logits_fn(), kVocab, {{1, 2, 3}}, p).ok());
  ASSERT_EQ(model.batches().size(), 14u);
  for (size_t i = 0; i < 14; ++i)
    EXPECT_EQ(model.batches()[i].cache_op, i % 7 == 0 ? CacheOp::kRefresh : CacheOp::kUse) << "forward " << i;
}

// Confidences of positions 2..9 (prompt {1, 2}, 8 new tokens, one block).
constexpr float kCrafted[8] = {0.5f, 0.95f, 0.3f, 0.9f, 0.8f, 0.2f, 0.4f, 0.1f};

Result<GenerateOutput> run_crafted(SamplingParams p, std::vector<std::vector<int64_t>>* steps,
                                   const UnmaskPolicy& policy = {}) {
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t j) { return j >= 2 && j < 10 ? kCrafted[j - 2] : 0.5f; }));
  GenerateHooks hooks;
  hooks.unmask_policy = policy;
  hooks.on_step = [&](const StepInfo& s) {
    std::vector<int64_t> positions;
    for (const MaskedPosition& mp : s.committed) positions.push_back(mp.position);
    steps->push_back(positions);
    return true;
  };
  return generate(model.logits_fn(), kVocab, {{1, 2}}, p, hooks);
}

TEST(ParallelDecoding, FactorRuleOnCraftedConfidences) {
  // Sorted 0.95, 0.9, 0.8, 0.5, …: (n+1)(1 − c_n) = 0.1, 0.3, 0.8, 2.5 → n = 3 with factor 1; then
  // 2·(1 − 0.5) = 1 is not < 1 → at least one per step.
  SamplingParams p = block_params(8, 1, 8);
  p.factor = 1.0f;
  std::vector<std::vector<int64_t>> steps;
  Result<GenerateOutput> out = run_crafted(p, &steps);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(steps, (std::vector<std::vector<int64_t>>{{3, 5, 6}, {2}, {8}, {4}, {7}, {9}}));
  EXPECT_EQ(out->generated[0], std::vector<int32_t>(8, kToken));

  // A larger factor takes more: 2.6 > 2.5 admits n = 4; then 0.4: 2·0.6 = 1.2 < 2.6, 3·0.7 = 2.1 < 2.6,
  // 4·0.8 = 3.2 → 2; then 0.2, 0.1: 2·0.8 = 1.6, 3·0.9 = 2.7 → 1; then 1.
  steps.clear();
  p.factor = 2.6f;
  ASSERT_TRUE(run_crafted(p, &steps).ok());
  EXPECT_EQ(steps, (std::vector<std::vector<int64_t>>{{2, 3, 5, 6}, {4, 8}, {7}, {9}}));
}

TEST(ParallelDecoding, ThresholdRuleOnCraftedConfidences) {
  SamplingParams p = block_params(8, 1, 8);
  p.threshold = 0.85f;
  std::vector<std::vector<int64_t>> steps;
  std::vector<int64_t> policy_k;
  ASSERT_TRUE(run_crafted(p, &steps).ok());
  EXPECT_EQ(steps, (std::vector<std::vector<int64_t>>{{3, 5}, {6}, {2}, {8}, {4}, {7}, {9}}));

  // unmask_policy gets the rule's count as k (and decides itself).
  steps.clear();
  ASSERT_TRUE(run_crafted(p, &steps, [&](const PolicyInput& in) {
                policy_k.push_back(in.k);
                return std::vector<int64_t>{in.masked_positions.front()};  // left to right
              }).ok());
  EXPECT_EQ(policy_k, (std::vector<int64_t>{2, 2, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(steps.front(), (std::vector<int64_t>{2}));
}

TEST(ParallelDecoding, ThresholdExtremes) {
  // τ > 1 is never met: exactly one token per step (the most confident), the blocks in order.
  SamplingParams p = block_params(12, 1, 4);
  p.threshold = 2.0f;
  std::vector<std::vector<int64_t>> steps;
  FakeModel model(kVocab, confidence_model([](int64_t, int64_t j) { return 0.2f + 0.05f * static_cast<float>(j % 5); }));
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(row_counts(*out, 0), std::vector<int64_t>(12, 1));
  EXPECT_EQ(out->timings.steps_run, 12);

  // τ → 0+ (any positive τ below every confidence): each block in one step. (τ <= 0 turns threshold off.)
  p.threshold = std::numeric_limits<float>::min();
  FakeModel model2(kVocab, confidence_model([](int64_t, int64_t j) { return 0.2f + 0.05f * static_cast<float>(j % 5); }));
  out = generate(model2.logits_fn(), kVocab, {{1, 2}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(row_counts(*out, 0), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(model2.batches().size(), 3u);
  EXPECT_EQ(out->generated[0], std::vector<int32_t>(12, kToken));

  // Steps are not used with threshold decoding (any value works).
  p.steps = 1000;
  FakeModel model3(kVocab, confidence_model([](int64_t, int64_t) { return 0.5f; }));
  out = generate(model3.logits_fn(), kVocab, {{1, 2}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->timings.steps_run, 3);
}

TEST(ParallelDecoding, RowsFinishTheirBlockIndependently) {
  // Row 0 is sure of everything, row 1 of nothing: row 0 commits its block at once, then waits.
  SamplingParams p = block_params(8, 1, 4);
  p.threshold = 0.9f;
  FakeModel model(kVocab, confidence_model([](int64_t b, int64_t j) { return b == 0 ? 0.99f : 0.2f + 0.01f * j; }));
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {4, 5}};  // row 1 is left-padded
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, prompts, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(row_counts(*out, 0), (std::vector<int64_t>{4, 0, 0, 0, 4, 0, 0, 0}));
  EXPECT_EQ(row_counts(*out, 1), std::vector<int64_t>(8, 1));
  // While row 0 waits, only row 1's positions are asked for; blocks are the same positions in both rows.
  const int64_t n_seq = 11;
  for (size_t f = 0; f < model.batches().size(); ++f) {
    const RecordedBatch& b = model.batches()[f];
    const bool row0_open = f % 4 == 0;
    for (int64_t row : b.out_rows) {
      if (!row0_open) {
        EXPECT_EQ(row / n_seq, 1) << "forward " << f;
      }
      const int64_t j = row % n_seq + 1, block = static_cast<int64_t>(f / 4);
      EXPECT_GE(j, 3 + 4 * block);
      EXPECT_LT(j, 3 + 4 * (block + 1));
    }
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out->generated[r], std::vector<int32_t>(8, kToken));
}

TEST(ParallelDecoding, ConfidenceIsTheTokenProbabilityWhateverTheAlgorithm) {
  for (Algorithm alg : {Algorithm::kOrigin, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy}) {
    SamplingParams p = block_params(8, 1, 8);
    p.alg = alg;
    p.threshold = 0.899f;  // 0.9 passes as a probability, not as a margin (0.893) or a negative entropy
    std::vector<std::vector<int64_t>> steps;
    ASSERT_TRUE(run_crafted(p, &steps).ok()) << algorithm_name(alg);
    EXPECT_EQ(steps.front(), (std::vector<int64_t>{3, 5})) << algorithm_name(alg);
  }
}

TEST(BlockDecoding, ParametersAreValidated) {
  SamplingParams p = block_params(8, 8, 4);
  p.block_length = -1;
  Status s = validate(p, kVocab);
  EXPECT_NE(s.message().find("block_length"), std::string::npos) << s.message();
  p.block_length = 4;
  p.threshold = std::nanf("");
  s = validate(p, kVocab);
  EXPECT_NE(s.message().find("threshold"), std::string::npos) << s.message();
  p.threshold = 0.9f;
  p.factor = std::numeric_limits<float>::infinity();
  s = validate(p, kVocab);
  EXPECT_NE(s.message().find("factor"), std::string::npos) << s.message();
  p.factor = 1.0f;
  s = validate(p, kVocab);
  EXPECT_NE(s.message().find("at most one"), std::string::npos) << s.message();
  p.factor = 0.0f;
  EXPECT_TRUE(validate(p, kVocab).ok());

  EXPECT_EQ(*parse_cache_mode("dual"), CacheMode::kDual);
  EXPECT_EQ(*parse_cache_mode("prefix"), CacheMode::kPrefix);
  EXPECT_EQ(*parse_cache_mode("none"), CacheMode::kNone);
  EXPECT_EQ(*parse_cache_mode("committed"), CacheMode::kCommitted);
  EXPECT_STREQ(cache_mode_name(CacheMode::kCommitted), "committed");
  Result<CacheMode> bad = parse_cache_mode("full");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("none, prefix, dual, committed"), std::string::npos);

  for (int every : {0, -3, static_cast<int>(kMaxSteps) + 1}) {
    p.refresh_every = every;
    s = validate(p, kVocab);
    EXPECT_NE(s.message().find("refresh_every: must be in [1, "), std::string::npos) << every << ": " << s.message();
  }
  p.refresh_every = 1;
  EXPECT_TRUE(validate(p, kVocab).ok());
}

}  // namespace
}  // namespace dc
