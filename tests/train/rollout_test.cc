// GRPO rollouts on the tiny-vocab fixture (real tokenizer): the policy viewed over f32 ModelParams gives
// the engine's own generation, the batch layout (left-padded prompts, G consecutive rows per prompt), the
// completion mask through the first <|im_end|>, the text with special tokens skipped, seeds, fast mode.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "engine_fixtures.h"
#include "fixtures.h"
#include "model/params.h"
#include "train/rollout.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

class RolloutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = testing::load_exact((fs::path(testing::fixtures_dir()) / "tiny-vocab").string(), 2);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    engine_ = std::move(*engine);
    auto params = ModelParams::from_weights(engine_->config(), engine_->model().weights());
    ASSERT_TRUE(params.ok()) << params.status().message();
    params_ = std::move(*params);
    policy_ = Model::from_weights(engine_->config(), params_.weights(), nullptr);  // as the trainer views them
    ctx_.pool = &engine_->pool();
    ctx_.matmul_precision = MatmulPrecision::kF32;
    options_.group_size = 3;
    options_.sampling = recipe_rollout_params(engine_->config());
    options_.sampling.max_new_tokens = 12;
    options_.sampling.steps = 12;
    options_.im_end_id = *engine_->tokenizer()->token_to_id("<|im_end|>");
    prompts_ = {*engine_->tokenizer()->encode("def add(a, b):"), *engine_->tokenizer()->encode("x")};
  }
  Result<RolloutBatch> rollouts(uint64_t seed, const GenerateHooks& hooks = {}) {
    return generate_rollouts(ctx_, *policy_, *engine_->tokenizer(), prompts_, options_, seed, hooks);
  }

  std::unique_ptr<Engine> engine_;
  ModelParams params_;
  std::unique_ptr<Model> policy_;
  Context ctx_;
  RolloutOptions options_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST(RolloutParams, RecipeDefaults) {
  ModelConfig c;
  c.mask_token_id = 151666, c.pad_token_id = 151643, c.max_position_embeddings = 131072;
  const SamplingParams p = recipe_rollout_params(c);
  EXPECT_EQ(*p.max_new_tokens, 256);
  EXPECT_EQ(p.steps, 256);
  EXPECT_EQ(p.alg, Algorithm::kEntropy);
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 50);
  EXPECT_EQ(p.alg_temp, 0.0f);
  EXPECT_EQ(p.mask_token_id, 151666);
  EXPECT_EQ(p.pad_token_id, 151643);
  EXPECT_EQ(p.block_length, 0);
  EXPECT_EQ(p.cache, CacheMode::kNone);
  EXPECT_FALSE(parallel_decoding(p));
  c.pad_token_id = -1, c.eos_token_id = 7;
  EXPECT_EQ(recipe_rollout_params(c).pad_token_id, 7);
}

TEST(RolloutMask, OnesThroughTheFirstImEnd) {
  const std::vector<int32_t> ids = {5, 9, 151645, 4, 151645, 8};
  EXPECT_EQ(completion_mask(ids, 151645), (std::vector<uint8_t>{1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(completion_mask(std::vector<int32_t>{151645, 1}, 151645), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(completion_mask(std::vector<int32_t>{1, 2, 3}, 151645), (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(completion_mask(ids, -1), std::vector<uint8_t>(6, 1));
  EXPECT_TRUE(completion_mask(std::vector<int32_t>{}, 151645).empty());
}

// A round generated in chunks: the narrower chunk's prompts are left-padded to the wider one's (mask 0 on the
// pads added), rows, texts and seconds follow in order; an empty batch takes the chunk; other group sizes or
// completion lengths are refused.
TEST(AppendRollouts, RepadsTheNarrowerPromptsAndKeepsTheOrder) {
  auto batch = [](int64_t width, int32_t first_id, const std::string& text) {
    RolloutBatch b;
    b.n_prompts = 1, b.group_size = 2, b.n_rows = 2, b.prompt_width = width, b.completion_length = 1;
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t i = 0; i < width; ++i) b.prompt_ids.push_back(first_id + static_cast<int32_t>(i));
      b.prompt_mask.insert(b.prompt_mask.end(), static_cast<size_t>(width), 1);
      b.completion_ids.push_back(first_id + 100), b.completion_mask.push_back(1), b.texts.push_back(text);
    }
    b.seconds = 1.5, b.timings.forwards = 3;
    return b;
  };
  RolloutBatch all;
  ASSERT_TRUE(append_rollouts(all, batch(1, 10, "a"), /*pad_id=*/0).ok());
  ASSERT_TRUE(append_rollouts(all, batch(3, 20, "b"), 0).ok());
  EXPECT_EQ(all.n_prompts, 2);
  EXPECT_EQ(all.n_rows, 4);
  EXPECT_EQ(all.prompt_width, 3);
  EXPECT_EQ(all.prompt_ids, (std::vector<int32_t>{0, 0, 10, 0, 0, 10, 20, 21, 22, 20, 21, 22}));
  EXPECT_EQ(all.prompt_mask, (std::vector<uint8_t>{0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(all.completion_ids, (std::vector<int32_t>{110, 110, 120, 120}));
  EXPECT_EQ(all.texts, (std::vector<std::string>{"a", "a", "b", "b"}));
  EXPECT_EQ(all.seconds, 3.0);
  EXPECT_EQ(all.timings.forwards, 6);
  RolloutBatch other = batch(1, 30, "c");
  other.completion_length = 2;
  EXPECT_EQ(append_rollouts(all, other, 0).code(), StatusCode::kInvalidArgument);
}

TEST_F(RolloutTest, TextSkipsSpecialTokensAndUnknownIds) {
  const Tokenizer& tok = *engine_->tokenizer();
  std::vector<int32_t> ids = *tok.encode("return 1");
  const std::vector<int32_t> tail = *tok.encode("<|im_end|>more<|dlm_pad|><|mask|>");
  ids.insert(ids.end(), tail.begin(), tail.end());
  ids.push_back(152000);  // an embedding row the tokenizer does not have
  auto text = completion_text(tok, ids);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "return 1more");
}

TEST_F(RolloutTest, SameTokensAsTheEngineGeneratingTheSameBatch) {
  auto b = rollouts(7);
  ASSERT_TRUE(b.ok()) << b.status().message();
  SamplingParams p = options_.sampling;
  p.num_return_sequences = 3;
  p.seed = 7;
  auto ref = engine_->generate(prompts_, p);  // the checkpoint's own weights, the same seed and batch
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  ASSERT_EQ(b->n_rows, 6);
  ASSERT_EQ(b->completion_length, 12);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t j = 0; j < 12; ++j)
      ASSERT_EQ(b->completion_ids[r * 12 + j], ref->generated[r][j]) << "row " << r << " position " << j;
  EXPECT_GT(b->tokens_per_second(), 0.0);
  EXPECT_EQ(b->timings.steps_run, 12);
}

TEST_F(RolloutTest, LayoutMaskAndText) {
  const int32_t im_end = options_.im_end_id;
  GenerateHooks hooks;  // row 4 (prompt 1, completion 1) gets <|im_end|> at new position 3 after the last step
  hooks.tokens_hook = [&](const TokensHookArgs& a) {
    if (a.step == a.n_steps - 1) a.canvas[4 * a.n_seq + (a.n_seq - 12) + 3] = im_end;
  };
  auto b = rollouts(11, hooks);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const int64_t P = b->prompt_width, L = b->completion_length;
  EXPECT_EQ(b->n_prompts, 2);
  EXPECT_EQ(b->group_size, 3);
  EXPECT_EQ(P, static_cast<int64_t>(prompts_[0].size()));
  ASSERT_EQ(b->prompt_ids.size(), static_cast<size_t>(6 * P));
  ASSERT_EQ(b->completion_mask.size(), static_cast<size_t>(6 * L));
  for (int64_t r = 0; r < 6; ++r) {
    const std::vector<int32_t>& prompt = prompts_[r / 3];  // G consecutive rows per prompt
    const int64_t pads = P - static_cast<int64_t>(prompt.size());
    for (int64_t i = 0; i < P; ++i) {
      EXPECT_EQ(b->prompt_mask[r * P + i], i >= pads ? 1 : 0) << "row " << r << " position " << i;
      EXPECT_EQ(b->prompt_ids[r * P + i], i >= pads ? prompt[i - pads] : options_.sampling.pad_token_id);
    }
    std::vector<int32_t> ids(b->completion_ids.begin() + r * L, b->completion_ids.begin() + (r + 1) * L);
    for (int32_t id : ids) EXPECT_NE(id, options_.sampling.mask_token_id) << "row " << r << " left masked";
    EXPECT_EQ(b->texts[r], *completion_text(*engine_->tokenizer(), ids));
    if (r != 4) continue;
    EXPECT_EQ(ids[3], im_end);
    for (int64_t j = 0; j < L; ++j) EXPECT_EQ(b->completion_mask[r * L + j], j <= 3 ? 1 : 0) << "position " << j;
    EXPECT_EQ(b->texts[r].find("<|im_end|>"), std::string::npos);
  }
}

TEST_F(RolloutTest, SeededAndReproducible) {
  auto a = rollouts(1), a2 = rollouts(1), c = rollouts(2);
  ASSERT_TRUE(a.ok() && a2.ok() && c.ok());
  EXPECT_EQ(a->completion_ids, a2->completion_ids);
  EXPECT_NE(a->completion_ids, c->completion_ids);
  std::set<std::vector<int32_t>> distinct;  // temperature 1: a group's completions differ
  for (int64_t g = 0; g < 3; ++g)
    distinct.insert(std::vector<int32_t>(a->completion_ids.begin() + g * 12, a->completion_ids.begin() + (g + 1) * 12));
  EXPECT_GT(distinct.size(), 1u);
}

TEST_F(RolloutTest, FastModeRunsWithItsOwnCache) {
  apply_fast_mode(options_.sampling);
  options_.sampling.block_length = 4;
  auto b = rollouts(3);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->completion_length, 12);
  EXPECT_GT(b->timings.cache_refreshes, 0);
  for (int32_t id : b->completion_ids) EXPECT_NE(id, options_.sampling.mask_token_id);
}

TEST_F(RolloutTest, Errors) {
  options_.group_size = 0;
  EXPECT_NE(rollouts(1).status().message().find("group_size"), std::string::npos);
  options_.group_size = 2;
  prompts_.push_back({});
  EXPECT_NE(rollouts(1).status().message().find("prompt 2 is empty"), std::string::npos);
  prompts_.back() = {1, 999999};
  EXPECT_NE(rollouts(1).status().message().find("prompt 2"), std::string::npos);
  prompts_.pop_back();
  options_.sampling.top_p = 0.0f;
  EXPECT_NE(rollouts(1).status().message().find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace dc::train
