// The public facade (include/diffucoder/diffucoder.h) against the PyTorch reference fixtures: generation
// token for token, forward logits, hooks, cancellation, and errors that name what is wrong.
#include <gtest/gtest.h>

#include <diffucoder/diffucoder.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "fixtures.h"
#include "train/trainer.h"
#include "temp_dir.h"

namespace {

using diffucoder::GenerationConfig;
using diffucoder::Model;
using dc::testing::fixtures_dir;
using dc::testing::load_json;

diffucoder::LoadOptions options(const std::string& dir, const std::string& precision = "f32") {
  diffucoder::LoadOptions o;
  o.model_dir = dir;
  o.threads = 2;
  o.precision = precision;
  o.weight_cache = "off";
  return o;
}

diffucoder::ForwardInput input(int64_t n_batch, int64_t n_seq, std::span<const int32_t> tokens,
                               std::span<const int32_t> positions = {}) {
  diffucoder::ForwardInput in;
  in.n_batch = n_batch;
  in.n_seq = n_seq;
  in.tokens = tokens;
  in.positions = positions;
  return in;
}

std::unique_ptr<Model> load_f32(const std::string& name) {
  auto m = Model::load(options(fixtures_dir() + "/" + name));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<std::vector<int32_t>> prompts_of(const nlohmann::json& c) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : c["prompts"]) out.push_back(p.get<std::vector<int32_t>>());
  return out;
}

GenerationConfig config_of(const Model& model, const nlohmann::json& params) {
  GenerationConfig c = model.default_config();
  c.alg = params["alg"].get<std::string>();
  c.steps = params["steps"].get<int>();
  c.max_new_tokens = params["max_new_tokens"].get<int64_t>();
  c.eps = params["eps"].get<float>();
  c.temperature = params["temperature"].get<float>();
  c.top_p = params["top_p"].is_null() ? 1.0f : params["top_p"].get<float>();
  c.top_k = params["top_k"].is_null() ? 0 : params["top_k"].get<int64_t>();
  c.alg_temp = params["alg_temp"].is_null() ? 0.0f : params["alg_temp"].get<float>();
  return c;
}

TEST(Api, GenerateEqualsTheReferenceWithHistory) {
  for (const char* name : {"tiny-gqa2", "tiny-vocab"}) {
    auto model = load_f32(name);
    ASSERT_NE(model, nullptr);
    const auto fixture = load_json(fixtures_dir() + "/" + name + "/reference/generate.json");
    for (const auto& c : fixture["cases"]) {
      GenerationConfig config = config_of(*model, c["params"]);
      config.output_history = true;
      auto out = model->generate(prompts_of(c), config);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(out->sequences, dc::testing::flatten<int32_t>(c["sequences"])) << name << " " << c["name"];
      ASSERT_EQ(out->history.size(), c["history"].size()) << c["name"];
      for (size_t s = 0; s < out->history.size(); ++s)
        EXPECT_EQ(out->history[s], dc::testing::flatten<int32_t>(c["history"][s])) << c["name"] << " step " << s;
    }
  }
}

TEST(Api, ForwardEqualsTheReferenceLogits) {
  auto model = load_f32("tiny-gqa2");
  ASSERT_NE(model, nullptr);
  const std::string dir = fixtures_dir() + "/tiny-gqa2/reference/";
  int compared = 0;
  const nlohmann::json forward = load_json(dir + "forward.json");
  for (const auto& c : forward["cases"]) {
    if (!c["attention_mask"].is_null()) continue;  // padded rows: the reference's pad rows are not compared
    const auto ids = dc::testing::flatten<int32_t>(c["input_ids"]);
    std::vector<int32_t> positions;
    if (!c["position_ids"].is_null()) positions = dc::testing::flatten<int32_t>(c["position_ids"]);
    const int64_t b = c["shape"][0], l = c["shape"][1];
    auto logits = model->forward(input(b, l, ids, positions));
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    const std::vector<float> want = dc::testing::load_f32(dir + c["logits_file"].get<std::string>());
    ASSERT_EQ(logits->size(), want.size()) << c["name"];
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR((*logits)[i], want[i], 1e-4f + 1e-4f * std::fabs(want[i])) << c["name"] << " at " << i;
    ++compared;
  }
  EXPECT_GE(compared, 3);  // b1_odd, b2_equal, b1_masked, b2_positions
}

TEST(Api, HooksSeeTheMaskedPositionsAndCanChangeTokens) {
  auto model = load_f32("tiny-gqa2");
  ASSERT_NE(model, nullptr);
  GenerationConfig c = model->default_config();
  c.max_new_tokens = 8;
  c.steps = 4;
  c.alg = "entropy";
  c.temperature = 0;
  const int32_t mask = model->info().mask_token_id;
  std::vector<int> token_steps, logits_steps, on_steps;
  diffucoder::Hooks hooks;
  hooks.on_logits = [&](const diffucoder::LogitsEvent& e) {
    logits_steps.push_back(e.step);
    ASSERT_EQ(e.logits.size(), e.indices.size() * e.n_vocab);
    for (int64_t idx : e.indices) EXPECT_EQ(e.canvas[idx], mask) << "a logits row for an unmasked position";
  };
  hooks.on_tokens = [&](const diffucoder::TokensEvent& e) {
    token_steps.push_back(e.step);
    e.canvas[e.n_seq - 1] = 7;  // force the last position, as the reference's token-control demo
  };
  hooks.on_step = [&](const diffucoder::StepEvent& s) {
    on_steps.push_back(s.step);
    return true;
  };
  auto out = model->generate({{1, 2, 3}}, c, hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(token_steps, (std::vector<int>{-1, 0, 1, 2, 3}));
  EXPECT_EQ(logits_steps, (std::vector<int>{0, 1, 2, 3}));  // 8 tokens in 4 steps: a forward every step
  EXPECT_EQ(on_steps, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(out->sequences.back(), 7);
}

TEST(Api, CancelFlagAndOnStepStopTheGeneration) {
  auto model = load_f32("tiny-gqa2");
  ASSERT_NE(model, nullptr);
  GenerationConfig c = model->default_config();
  c.max_new_tokens = 16;
  c.steps = 16;
  std::atomic<bool> stop{false};
  int steps_seen = 0;
  diffucoder::Hooks hooks;
  hooks.cancel = &stop;
  hooks.on_step = [&](const diffucoder::StepEvent& s) {
    ++steps_seen;
    if (s.step == 2) stop = true;
    return true;
  };
  auto out = model->generate({{1, 2, 3}}, c, hooks);
  EXPECT_EQ(out.status().code(), diffucoder::StatusCode::kCancelled);
  EXPECT_EQ(steps_seen, 3);
  hooks.cancel = nullptr;
  hooks.on_step = [](const diffucoder::StepEvent&) { return false; };
  EXPECT_EQ(model->generate({{1, 2, 3}}, c, hooks).status().code(), diffucoder::StatusCode::kCancelled);
}

TEST(Api, ErrorsNameTheFieldOrFile) {
  auto missing = Model::load(options("/nonexistent/checkpoint"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/checkpoint"), std::string::npos) << missing.status().message();
  auto precision = Model::load(options(fixtures_dir() + "/tiny-gqa2", "f64"));
  ASSERT_FALSE(precision.ok());
  EXPECT_NE(precision.status().message().find("precision"), std::string::npos);
  GenerationConfig c;
  c.steps = 0;
  EXPECT_NE(diffucoder::check_config(c).message().find("steps"), std::string::npos);
  c.steps = 4;
  c.alg = "greedy";
  EXPECT_NE(diffucoder::check_config(c).message().find("entropy"), std::string::npos);
  c.alg = "entropy";
  c.cache = "lru";
  EXPECT_NE(diffucoder::check_config(c).message().find("dual, committed"), std::string::npos);
  c.cache = "committed";
  c.refresh_every = 0;
  EXPECT_NE(diffucoder::check_config(c).message().find("refresh_every: must be in [1, "), std::string::npos)
      << diffucoder::check_config(c).message();
  c.refresh_every = 2;
  EXPECT_TRUE(diffucoder::check_config(c).ok());
  c.cache = "none";
  EXPECT_TRUE(diffucoder::check_config(c).ok());

  auto model = load_f32("tiny-gqa2");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->tokenizer(), nullptr);
  EXPECT_EQ(model->encode_prompt("hi", false).status().code(), diffucoder::StatusCode::kNotFound);
  const std::vector<int32_t> ids = {1, 2, 100000};
  auto bad = model->forward(input(1, 3, ids));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("input_ids"), std::string::npos) << bad.status().message();
  auto shape = model->forward(input(2, 3, ids));
  EXPECT_EQ(shape.status().code(), diffucoder::StatusCode::kInvalidArgument);
}

TEST(Api, TokenizerAloneEqualsTheModelsAndChatTemplate) {
  const std::string dir = fixtures_dir() + "/tiny-vocab";
  auto tok = diffucoder::Tokenizer::load(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto model = Model::load(options(dir, "auto"));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const std::string text = Model::instruct_prompt("  Write a sort.  ");
  EXPECT_EQ(text, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a sort.\n"
                  "<|im_end|>\n<|im_start|>assistant\n");
  auto a = (*tok)->encode(text);
  auto b = (*model)->encode_prompt("  Write a sort.  ", /*chat=*/true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  std::vector<int32_t> with_unknown = *a;
  with_unknown.push_back(152000);  // an embedding row past the tokenizer: dropped, as Hugging Face does
  EXPECT_EQ(*(*tok)->decode(with_unknown), text);
  EXPECT_EQ((*tok)->token_to_id("<|mask|>"), 151666);
  EXPECT_EQ((*tok)->size(), 151668);
  auto chat = Model::apply_chat_template({{"user", "hi"}}, true);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(*chat, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                   "<|im_start|>assistant\n");
  EXPECT_FALSE(Model::apply_chat_template({{"robot", "hi"}}, true).ok());
}

// The checks a server reports in its own words before submitting (Model::canvas_length, check_generation_size,
// check_token_ids, kv_cache_bytes), the fast mode spelt out (resolve_fast: the same sampler settings),
// check_config's one step per block, and LoadOptions::lora_adapters' refusals naming the flag's rule.
TEST(Api, ModelSizeChecksFastDefaultsAndNamedAdapters) {
  auto model = load_f32("tiny-gqa2");
  ASSERT_NE(model, nullptr);
  const diffucoder::ModelInfo& info = model->info();
  GenerationConfig c = model->default_config();
  c.max_new_tokens = 8;
  EXPECT_EQ(*model->canvas_length(5, c), 13);
  EXPECT_TRUE(model->check_generation_size({{1, 2, 3, 4, 5}}, c).ok());
  c.max_new_tokens = info.max_position_embeddings;
  const auto too_long = model->canvas_length(5, c);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("max_position_embeddings"), std::string::npos) << too_long.status().message();
  c.max_new_tokens = 8;
  c.num_return_sequences = 1 << 20;
  const diffucoder::Status rows = model->check_generation_size({{1, 2, 3}}, c);
  EXPECT_EQ(rows.code(), diffucoder::StatusCode::kOutOfRange);
  EXPECT_NE(rows.message().find("rows"), std::string::npos) << rows.message();
  const std::vector<int32_t> ids = {1, static_cast<int32_t>(info.n_vocab)};
  EXPECT_EQ(model->check_token_ids(ids, "prompt").message(),
            "prompt: token id " + std::to_string(info.n_vocab) + " at index 1 is outside the vocabulary [0, " +
                std::to_string(info.n_vocab) + ")");
  EXPECT_TRUE(model->check_token_ids(std::span<const int32_t>(ids.data(), 1), "prompt").ok());
  EXPECT_GT(model->kv_cache_bytes(1, 16), 0);
  EXPECT_EQ(model->kv_cache_bytes(2, 16), 2 * model->kv_cache_bytes(1, 16));
  EXPECT_EQ(model->max_kv_cache_bytes(), diffucoder::LoadOptions{}.max_kv_cache_bytes);
  EXPECT_GT(model->head_block_bytes(), 0);

  GenerationConfig fast;
  fast.fast = true;
  const GenerationConfig spelt = diffucoder::resolve_fast(fast).value();
  EXPECT_FALSE(spelt.fast);
  EXPECT_EQ(spelt.block_length, 32);
  EXPECT_EQ(spelt.cache, "dual");
  EXPECT_FLOAT_EQ(spelt.threshold, 0.9f);
  fast.block_length = 8;
  fast.factor = 1.5f;  // parallel decoding already: no threshold added
  const GenerationConfig kept = diffucoder::resolve_fast(fast).value();
  EXPECT_EQ(kept.block_length, 8);
  EXPECT_EQ(kept.threshold, 0.0f);
  EXPECT_EQ(diffucoder::resolve_fast(c).value().cache, c.cache);  // without fast: unchanged

  GenerationConfig blocks;
  blocks.max_new_tokens = 64;
  blocks.block_length = 8;
  blocks.steps = 4;
  EXPECT_NE(diffucoder::check_config(blocks).message().find("steps: block decoding needs at least one step per block"),
            std::string::npos) << diffucoder::check_config(blocks).message();
  blocks.steps = 8;
  EXPECT_TRUE(diffucoder::check_config(blocks).ok());

  diffucoder::LoadOptions twice = options(fixtures_dir() + "/tiny-gqa2");
  twice.lora_adapters = {{"x", "/nonexistent/a"}, {"x", "/nonexistent/b"}};
  EXPECT_NE(Model::load(twice).status().message().find("'x' is given twice"), std::string::npos);
  twice.lora_adapters.pop_back();
  twice.lora_dir = "/nonexistent/c";
  EXPECT_NE(Model::load(twice).status().message().find("cannot be combined with named adapters"), std::string::npos);
}

// The facade's Trainer is train::Trainer behind the public types: the same losses bit for bit, steps
// counted, a checkpoint written; bad settings are refused naming the field.
TEST(ApiTrainer, StepsAsTheLibraryTrainerAndRefusesBadSettings) {
  namespace fs = std::filesystem;
  const dc::test::TempDir tmp("api_train");
  const fs::path dir = tmp.path();
  {
    std::ofstream data(dir / "sft.jsonl");
    for (int i = 0; i < 6; ++i)
      data << R"({"prompt": "def f)" << i << R"((x):", "completion": "\n    return x + )" << i << "\"}\n";
  }
  diffucoder::TrainConfig c;
  c.model_dir = fixtures_dir() + "/tiny-vocab";
  c.data_path = (dir / "sft.jsonl").string();
  c.instruct_template = true;
  c.seq_len = 48, c.batch_size = 2, c.steps = 3, c.lr = 1e-3, c.threads = 2, c.precision = "f32";
  c.out_dir = (dir / "facade").string();
  auto facade = diffucoder::Trainer::create(c);
  ASSERT_TRUE(facade.ok()) << facade.status().to_string();
  EXPECT_EQ((*facade)->precision(), "f32");

  dc::train::TrainOptions o;
  o.model_dir = c.model_dir, o.data_path = c.data_path, o.instruct_template = true;
  o.seq_len = 48, o.batch_size = 2, o.steps = 3, o.lr.lr = 1e-3, o.lr.total_steps = 3;
  o.precision = dc::MatmulPrecision::kF32;
  dc::ThreadPool pool(2);
  dc::Context ctx;
  ctx.pool = &pool;
  auto library = dc::train::Trainer::create(o, ctx);
  ASSERT_TRUE(library.ok()) << library.status().to_string();
  for (int64_t step = 1; step <= 3; ++step) {
    auto a = (*facade)->step();
    auto b = (*library)->step();
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(a->step, step);
    EXPECT_TRUE(std::isfinite(a->loss));
    EXPECT_EQ(a->loss, b->loss) << "step " << step;
    EXPECT_EQ(a->grad_norm, b->grad_norm) << "step " << step;
  }
  EXPECT_EQ((*facade)->steps_done(), 3);
  ASSERT_TRUE((*facade)->save().ok());
  EXPECT_TRUE(fs::exists(dir / "facade" / "checkpoint-000003" / "model.safetensors"));

  auto refused = [&](diffucoder::TrainConfig bad, const std::string& field) {
    auto t = diffucoder::Trainer::create(bad);
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_NE(t.status().message().find(field), std::string::npos) << t.status().message();
  };
  diffucoder::TrainConfig bad = c;
  bad.out_dir = "";
  bad.precision = "f16";
  refused(bad, "precision");
  bad = c, bad.out_dir = "", bad.lr_schedule = "exponential";
  refused(bad, "exponential");
  bad = c, bad.out_dir = "", bad.data_path = (dir / "missing.jsonl").string();
  refused(bad, "missing.jsonl");
  bad = c, bad.out_dir = "", bad.steps = 0;
  refused(bad, "steps");
}

}  // namespace
