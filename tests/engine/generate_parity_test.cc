// Deterministic generation (temperature 0) through Engine::generate against the PyTorch reference:
// maskgit_plus, topk_margin, entropy (and origin with one step), batch 1 and left-padded batch 3,
// steps equal to and fewer than the new tokens, with and without top-p / top-k.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"

namespace dc {
namespace {

using testing::load_exact;
using testing::reference_params;

TEST(GenerateParity, TokenIdenticalToReference) {
  const auto manifest = dc::testing::load_manifest();
  int n_cases = 0;
  for (const auto& m : manifest["models"]) {
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    auto engine = load_exact(dir, 2);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const auto gen = dc::testing::load_json(dir + "/reference/generate.json");
    for (const auto& c : gen["cases"]) {
      std::vector<std::vector<int32_t>> prompts = c["prompts"].get<std::vector<std::vector<int32_t>>>();
      const SamplingParams params = reference_params(**engine, c["params"]);
      auto out = (*engine)->generate(prompts, params);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      const auto want = c["sequences"].get<std::vector<std::vector<int32_t>>>();
      ASSERT_EQ(out->sequences.size(), want.size());
      for (size_t r = 0; r < want.size(); ++r) {
        ASSERT_EQ(out->sequences[r].size(), want[r].size()) << c["name"] << " row " << r;
        for (size_t i = 0; i < want[r].size(); ++i)
          ASSERT_EQ(out->sequences[r][i], want[r][i])
              << m["name"] << "/" << c["name"] << " row " << r << " position " << i;
      }
      if (c.contains("transfer_counts") && params.alg != Algorithm::kOrigin) {
        const auto counts = c["transfer_counts"].get<std::vector<int64_t>>();
        ASSERT_EQ(out->committed_counts.size(), counts.size()) << c["name"];
        for (size_t s = 0; s < counts.size(); ++s)
          EXPECT_EQ(out->committed_counts[s][0], counts[s]) << c["name"] << " step " << s;
      }
      ++n_cases;
    }
  }
  EXPECT_GE(n_cases, 60);
}

TEST(GenerateParity, ChatPromptOnRealVocabularyMatchesReferenceText) {
  const auto manifest = dc::testing::load_manifest();
  for (const auto& m : manifest["models"]) {
    if (!m["has_tokenizer"].get<bool>()) continue;
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    auto engine = load_exact(dir, 2);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    ASSERT_NE((*engine)->tokenizer(), nullptr);
    const auto gen = dc::testing::load_json(dir + "/reference/generate.json");
    for (const auto& c : gen["cases"]) {
      if (!c.contains("prompt_texts")) continue;
      // The reference's prompt ids came from Hugging Face tokenizers; ours must be the same.
      const auto texts = c["prompt_texts"].get<std::vector<std::string>>();
      const auto prompts = c["prompts"].get<std::vector<std::vector<int32_t>>>();
      for (size_t i = 0; i < texts.size(); ++i) {
        auto ids = (*engine)->encode_prompt(texts[i], false);
        ASSERT_TRUE(ids.ok());
        EXPECT_EQ(*ids, prompts[i]) << c["name"];
      }
      return;
    }
  }
  FAIL() << "no fixture with a tokenizer and prompt texts";
}

TEST(Engine, PromptLongerThanContextIsRejected) {
  const auto manifest = dc::testing::load_manifest();
  ASSERT_FALSE(manifest["models"].empty());
  auto engine = load_exact(dc::testing::fixtures_dir() + "/" + manifest["models"][0]["dir"].get<std::string>(), 1);
  ASSERT_TRUE(engine.ok());
  SamplingParams p = (*engine)->default_params();
  p.max_new_tokens = (*engine)->config().max_position_embeddings;
  p.steps = 4;
  auto out = (*engine)->generate({{1, 2, 3}}, p);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("max_position_embeddings"), std::string::npos) << out.status().message();
  auto bad = (*engine)->generate({{1, 100000}}, (*engine)->default_params());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prompt 0"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace dc
