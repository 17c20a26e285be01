// generate()'s hooks (on_step, logits_hook, tokens_hook, unmask_policy), history, alg_temp, uneven
// masked counts, parameter validation and the error paths; plus parse/name and truncate_at_stop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "sampler/fake_model.h"
#include "sampler/generate.h"

namespace dc {
namespace {

using testing::FakeModel;

using testing::kMask;
using testing::kPad;
using testing::kVocab;

SamplingParams hook_params(int64_t new_tokens, int steps) {
  SamplingParams p;
  p.max_new_tokens = new_tokens;
  p.steps = steps;
  p.mask_token_id = kMask;
  p.pad_token_id = kPad;
  p.temperature = 0.0f;
  p.alg = Algorithm::kMaskgitPlus;
  return p;
}

// Peak on token 2 whose height grows with the index: later positions are more confident.
void rising(const ForwardBatch&, int64_t, int64_t i, float* logits) {
  std::fill(logits, logits + kVocab, 0.0f);
  logits[2] = 1.0f + 0.5f * static_cast<float>(i);
}

std::vector<int64_t> commit_order(const SamplingParams& p, GenerateHooks hooks, const testing::RowFn& fn,
                                  Status* status = nullptr) {
  std::vector<int64_t> order;
  hooks.on_step = [&](const StepInfo& info) {
    for (const MaskedPosition& mp : info.committed) order.push_back(mp.position);
    return true;
  };
  FakeModel model(kVocab, fn);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}}, p, hooks);
  if (status != nullptr) *status = out.status();
  return order;
}

TEST(Hooks, CustomPolicyCommitsLeftToRight) {
  const SamplingParams p = hook_params(6, 6);
  // Without a policy the most confident (rightmost) positions go first.
  EXPECT_EQ(commit_order(p, {}, rising), (std::vector<int64_t>{7, 6, 5, 4, 2, 3}));
  GenerateHooks hooks;
  int calls = 0;
  hooks.unmask_policy = [&](const PolicyInput& in) {
    ++calls;
    EXPECT_EQ(in.row, 0);
    EXPECT_EQ(in.tokens.size(), 8u);
    EXPECT_EQ(in.masked_positions.size(), in.confidences.size());
    EXPECT_EQ(in.masked_positions.size(), in.proposed_tokens.size());
    EXPECT_LE(in.k, static_cast<int64_t>(in.masked_positions.size()));
    for (int32_t t : in.proposed_tokens) EXPECT_EQ(t, 2);
    for (size_t i = 1; i < in.confidences.size(); ++i) EXPECT_GT(in.confidences[i], in.confidences[i - 1]);
    return std::vector<int64_t>(in.masked_positions.begin(), in.masked_positions.begin() + in.k);
  };
  EXPECT_EQ(commit_order(p, hooks, rising), (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(calls, 6);
  // The policy also replaces origin's random choice.
  SamplingParams origin = p;
  origin.alg = Algorithm::kOrigin;
  EXPECT_EQ(commit_order(origin, hooks, rising), (std::vector<int64_t>{2, 3, 4, 5, 6, 7}));
}

TEST(Hooks, CustomPolicyAnswersAreValidated) {
  const SamplingParams p = hook_params(4, 4);
  GenerateHooks hooks;
  hooks.unmask_policy = [](const PolicyInput&) { return std::vector<int64_t>{0}; };  // a prompt position
  Status st;
  commit_order(p, hooks, rising, &st);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unmask_policy"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not a masked position"), std::string::npos) << st.message();
  hooks.unmask_policy = [](const PolicyInput& in) {
    return std::vector<int64_t>{in.masked_positions[0], in.masked_positions[0]};
  };
  commit_order(p, hooks, rising, &st);
  EXPECT_NE(st.message().find("twice"), std::string::npos) << st.message();
}

TEST(Hooks, OnStepFalseCancels) {
  const SamplingParams p = hook_params(8, 8);
  GenerateHooks hooks;
  int seen = 0;
  hooks.on_step = [&](const StepInfo& info) {
    ++seen;
    EXPECT_EQ(info.n_steps, 8);
    EXPECT_EQ(info.canvas.size(), 10u);
    EXPECT_EQ(info.prompt_lengths[0], 2);
    EXPECT_EQ(info.pad_counts[0], 0);
    return info.step < 2;
  };
  FakeModel model(kVocab, rising);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}}, p, hooks);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(is_cancelled(out.status()));
  EXPECT_EQ(out.status().code(), StatusCode::kCancelled);
  EXPECT_NE(out.status().message().find("cancelled"), std::string::npos);
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(model.batches().size(), 2u);  // step 0 has k = 0 and runs no forward
  EXPECT_FALSE(is_cancelled(invalid_argument("x")));
  EXPECT_FALSE(is_cancelled(internal_error("cancelled: a message is not a code")));
}

TEST(Hooks, TokensHookForcesASuffix) {
  const SamplingParams p = hook_params(6, 6);
  std::vector<int> steps_seen;
  GenerateHooks hooks;
  hooks.tokens_hook = [&](const TokensHookArgs& args) {
    steps_seen.push_back(args.step);
    for (int64_t b = 0; b < args.n_rows; ++b) {
      args.canvas[b * args.n_seq + args.n_seq - 1] = 9;
      args.canvas[b * args.n_seq + args.n_seq - 2] = 9;
    }
  };
  FakeModel model(kVocab, rising);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}, {3, 4}}, p, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(steps_seen, (std::vector<int>{-1, 0, 1, 2, 3, 4, 5}));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out->generated[r], (std::vector<int32_t>{2, 2, 2, 2, 9, 9}));
  // The forced positions are never masked, so never requested: 4 masked positions per row at step 0.
  EXPECT_EQ(model.batches().front().out_rows, (std::vector<int64_t>{1, 2, 3, 4, 9, 10, 11, 12}));

  hooks.tokens_hook = [](const TokensHookArgs& args) { args.canvas[3] = 99; };
  FakeModel model2(kVocab, rising);
  Result<GenerateOutput> bad = generate(model2.logits_fn(), kVocab, {{1, 2}}, p, hooks);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokens_hook"), std::string::npos) << bad.status().message();
}

TEST(Hooks, LogitsHookEditsLogitsOfTheSampledPositions) {
  SamplingParams p = hook_params(5, 5);
  GenerateHooks hooks;
  hooks.logits_hook = [](const LogitsHookArgs& args) {
    EXPECT_EQ(args.logits.size(), args.positions.size() * static_cast<size_t>(args.n_vocab));
    for (size_t r = 0; r < args.positions.size(); ++r) {
      EXPECT_EQ(args.canvas[args.positions[r].row * args.n_seq + args.positions[r].position], kMask);
      args.logits[r * args.n_vocab + 2] = -std::numeric_limits<float>::infinity();  // ban token 2
      args.logits[r * args.n_vocab + 11] = 0.5f;
    }
  };
  FakeModel model(kVocab, rising);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}}, p, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->generated[0], std::vector<int32_t>(5, 11));
}

TEST(Output, HistoryHasOneCanvasPerStep) {
  SamplingParams p = hook_params(6, 4);
  p.output_history = true;
  FakeModel model(kVocab, rising);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}, {3}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->history.size(), 4u);
  std::vector<int32_t> flat;
  for (const auto& row : out->sequences) flat.insert(flat.end(), row.begin(), row.end());
  EXPECT_EQ(out->history.back(), flat);
  int64_t prev_masks = 1 << 30;
  for (const auto& canvas : out->history) {
    const int64_t masks = std::count(canvas.begin(), canvas.end(), kMask);
    EXPECT_LT(masks, prev_masks);
    prev_masks = masks;
  }
  p.output_history = false;
  EXPECT_TRUE(generate(model.logits_fn(), kVocab, {{1, 2}}, p)->history.empty());
}

TEST(Generate, UnevenMaskedCountsNeverRemask) {
  // Row 0's generated part is pre-filled except its last 2 positions; row 1 keeps all 8 masked.
  // The batch-average k (from 5 masked per row) is capped per row, so row 0 is never re-masked, and the
  // last step takes each row's own remainder (the reference would take int(2.5) = 2 in both rows).
  SamplingParams p = hook_params(8, 4);
  p.alg = Algorithm::kEntropy;
  GenerateHooks hooks;
  hooks.tokens_hook = [](const TokensHookArgs& args) {
    if (args.step == -1) {
      for (int64_t i = 2; i < args.n_seq - 2; ++i) args.canvas[i] = 8;
    }
  };
  FakeModel model(kVocab, rising);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}, {3, 4}}, p, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->generated[0], (std::vector<int32_t>{8, 8, 8, 8, 8, 8, 2, 2}));
  EXPECT_EQ(out->generated[1], std::vector<int32_t>(8, 2));
  int64_t row0 = 0, row1 = 0;
  for (const auto& c : out->committed_counts) {
    row0 += c[0];
    row1 += c[1];
  }
  EXPECT_EQ(row0, 2);
  EXPECT_EQ(row1, 8);
}

TEST(Generate, AlgTempSamplesPositions) {
  SamplingParams p = hook_params(12, 4);
  p.alg = Algorithm::kEntropy;
  p.alg_temp = 0.5f;
  std::vector<std::vector<int64_t>> orders;
  for (uint64_t seed : {1, 1, 2}) {
    p.seed = seed;
    orders.push_back(commit_order(p, {}, rising));
    std::vector<int64_t> sorted = orders.back();
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  }
  EXPECT_EQ(orders[0], orders[1]);
  EXPECT_NE(orders[0], orders[2]);
}

TEST(Errors, LogitsFnFailureAndNonFiniteLogits) {
  const SamplingParams p = hook_params(4, 2);  // k = 1 at step 0
  LogitsFn failing = [](const ForwardBatch&, float*) { return io_error("device lost"); };
  Result<GenerateOutput> out = generate(failing, kVocab, {{1}}, p);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kIoError);
  EXPECT_NE(out.status().message().find("forward at step 0"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("device lost"), std::string::npos);

  FakeModel nan_model(kVocab, [](const ForwardBatch&, int64_t, int64_t, float* logits) {
    std::fill(logits, logits + kVocab, 0.0f);
    logits[4] = std::nanf("");
  });
  out = generate(nan_model.logits_fn(), kVocab, {{1}}, p);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("NaN"), std::string::npos) << out.status().message();
  EXPECT_FALSE(generate(LogitsFn(), kVocab, {{1}}, p).ok());
}

TEST(Errors, PromptsAreChecked) {
  const SamplingParams p = hook_params(4, 4);
  FakeModel model(kVocab, rising);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1}, {16}}, p);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("prompts[1]: token id 16 at index 0"), std::string::npos)
      << out.status().message();
  out = generate(model.logits_fn(), kVocab, {}, p);
  EXPECT_NE(out.status().message().find("prompts"), std::string::npos);
}

TEST(Params, DefaultsAreTheReferenceEffectiveDefaults) {
  const SamplingParams p;
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 50);
  EXPECT_EQ(p.steps, 512);
  EXPECT_EQ(p.eps, 1e-3f);
  EXPECT_EQ(p.alg, Algorithm::kOrigin);
  EXPECT_EQ(p.alg_temp, 0.0f);
  EXPECT_FALSE(p.max_new_tokens.has_value());
  EXPECT_FALSE(p.max_length.has_value());
  EXPECT_EQ(p.num_return_sequences, 1);
  EXPECT_EQ(p.seed, 0u);
  EXPECT_FALSE(p.output_history);
  EXPECT_EQ(p.mask_token_id, 151666);
  EXPECT_EQ(p.pad_token_id, 151643);
  EXPECT_TRUE(validate(p, 152064).ok());
}

TEST(Params, InvalidValuesNameTheField) {
  struct Case {
    const char* field;
    std::function<void(SamplingParams&)> mutate;
  };
  const float nan = std::nanf("");
  const std::vector<Case> cases{
      {"steps", [](SamplingParams& p) { p.steps = 0; }},
      {"eps", [](SamplingParams& p) { p.eps = 0.0f; }},
      {"eps", [](SamplingParams& p) { p.eps = 1.0f; }},
      {"eps", [&](SamplingParams& p) { p.eps = nan; }},
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [&](SamplingParams& p) { p.temperature = nan; }},
      {"temperature", [](SamplingParams& p) { p.temperature = INFINITY; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"top_p", [&](SamplingParams& p) { p.top_p = nan; }},
      {"alg_temp", [](SamplingParams& p) { p.alg_temp = -1.0f; }},
      {"num_return_sequences", [](SamplingParams& p) { p.num_return_sequences = 0; }},
      {"max_new_tokens", [](SamplingParams& p) { p.max_new_tokens = 0; }},
      {"max_length", [](SamplingParams& p) { p.max_length = -3; }},
      {"mask_token_id", [](SamplingParams& p) { p.mask_token_id = 16; }},
      {"mask_token_id", [](SamplingParams& p) { p.mask_token_id = -1; }},
      {"pad_token_id", [](SamplingParams& p) { p.pad_token_id = 99; }},
      {"pad_token_id", [](SamplingParams& p) { p.pad_token_id = kMask; }},
      {"max_position_embeddings", [](SamplingParams& p) { p.max_position_embeddings = -1; }},
  };
  for (const Case& c : cases) {
    SamplingParams p = hook_params(4, 4);
    ASSERT_TRUE(validate(p, kVocab).ok());
    c.mutate(p);
    Status st = validate(p, kVocab);
    ASSERT_FALSE(st.ok()) << c.field;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind(c.field, 0), 0u) << "message should start with the field: " << st.message();
    // generate() rejects them too, before calling the model.
    FakeModel model(kVocab, rising);
    EXPECT_FALSE(generate(model.logits_fn(), kVocab, {{1}}, p).ok());
    EXPECT_TRUE(model.batches().empty());
  }
  EXPECT_FALSE(validate(SamplingParams{}, 0).ok());
}

TEST(Params, CanvasLengthRules) {
  SamplingParams p;
  EXPECT_EQ(*canvas_length(p, 7), 27);  // default max_length 20 → prompt + 20
  p.max_position_embeddings = 25;
  EXPECT_EQ(*canvas_length(p, 7), 25);
  p.max_length = 30;
  EXPECT_EQ(*canvas_length(p, 7), 30);  // explicit total
  p.max_new_tokens = 5;
  EXPECT_EQ(*canvas_length(p, 7), 12);  // max_new_tokens wins
  SamplingParams q;
  q.max_length = 7;
  Result<int64_t> bad = canvas_length(q, 7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("max_length"), std::string::npos) << bad.status().message();
}

TEST(Params, AlgorithmNames) {
  for (Algorithm alg : {Algorithm::kOrigin, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy}) {
    Result<Algorithm> parsed = parse_algorithm(algorithm_name(alg));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, alg);
  }
  EXPECT_STREQ(algorithm_name(Algorithm::kTopkMargin), "topk_margin");
  Result<Algorithm> bad = parse_algorithm("greedy");
  ASSERT_FALSE(bad.ok());
  for (const char* name : {"alg", "greedy", "origin", "maskgit_plus", "topk_margin", "entropy"}) {
    EXPECT_NE(bad.status().message().find(name), std::string::npos) << bad.status().message();
  }
}

TEST(PostProcess, TruncateAtStop) {
  EXPECT_EQ(truncate_at_stop({5, 6, 7, 8, 7}, {7}), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(truncate_at_stop({5, 6, 7, 8}, {8, 6}), (std::vector<int32_t>{5}));
  EXPECT_EQ(truncate_at_stop({5, 6}, {9}), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(truncate_at_stop({9, 6}, {9}), (std::vector<int32_t>{}));
  EXPECT_EQ(truncate_at_stop({5, 6}, {}), (std::vector<int32_t>{5, 6}));
}

}  // namespace
}  // namespace dc
