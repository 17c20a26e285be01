// EngineOptions::lora_mode kUnmerged (--lora-mode unmerged): the base kept as it is and the adapter added by
// every forward gives the merged engine's logits and greedy tokens in every cache mode; adapters it cannot hold
// (modules_to_save, an lm_head target) and bad names of serve's adapters are refused by name (on a device:
// tests/model/vulkan/forward_vulkan_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "batch_case.h"
#include "engine/engine.h"
#include "fixtures.h"

namespace dc {
namespace {

std::string unmerged_fixture(const std::string& rel) {
  const char* d = std::getenv("DC_LORA_FIXTURES_DIR");
  return std::string(d != nullptr ? d : "") + "/" + rel;
}

Result<std::unique_ptr<Engine>> load_with_lora(const std::string& adapter, LoraMode mode) {
  EngineOptions o;
  o.model_dir = testing::fixtures_dir() + "/tiny-gqa2";
  o.n_threads = 2;
  o.matmul_precision = MatmulPrecision::kF32;
  o.weight_cache = "off";
  o.lora_dir = adapter;
  o.lora_mode = mode;
  return Engine::load(o);
}

TEST(LoraUnmerged, EqualsMergedInEveryCacheMode) {
  auto merged = load_with_lora(unmerged_fixture("list_all/adapter"), LoraMode::kMerged);
  auto unmerged = load_with_lora(unmerged_fixture("list_all/adapter"), LoraMode::kUnmerged);
  auto base = load_with_lora("", LoraMode::kMerged);
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  ASSERT_TRUE(unmerged.ok()) << unmerged.status().to_string();
  ASSERT_TRUE(base.ok());
  EXPECT_NE((*unmerged)->lora_note().find("unmerged"), std::string::npos) << (*unmerged)->lora_note();
  // The logits of one full forward (logits_fn: the adapter added although the batch names none).
  const std::vector<int32_t> ids = {3, 17, 101, 5, 250, 42, 7};
  const BatchCase k = every_position(1, static_cast<int64_t>(ids.size()), [&](int64_t i) { return ids[i]; });
  const ForwardBatch b = k.view();
  const int64_t V = (*merged)->config().n_vocab;
  std::vector<float> lm(k.rows.size() * V), lu(lm.size()), lb(lm.size());
  ASSERT_TRUE((*merged)->logits_fn()(b, lm.data()).ok());
  ASSERT_TRUE((*unmerged)->logits_fn()(b, lu.data()).ok());
  ASSERT_TRUE((*base)->logits_fn()(b, lb.data()).ok());
  double scale = 0, diff = 0, from_base = 0;
  for (size_t i = 0; i < lm.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(lm[i])));
    diff = std::max(diff, std::abs(static_cast<double>(lm[i]) - lu[i]));
    from_base = std::max(from_base, std::abs(static_cast<double>(lm[i]) - lb[i]));
  }
  EXPECT_LE(diff, 1e-5 * scale);
  EXPECT_GT(from_base, 1e-2 * scale) << "the adapter changes nothing: the test proves nothing";
  // Greedy generations, every cache mode (blocks for the caches).
  for (CacheMode cache : {CacheMode::kNone, CacheMode::kPrefix, CacheMode::kDual}) {
    SamplingParams p = (*merged)->default_params();
    p.max_new_tokens = 12;
    p.steps = 12;
    p.temperature = 0.0f;
    p.cache = cache;
    if (cache != CacheMode::kNone) p.block_length = 4;
    auto m = (*merged)->generate({{1, 2, 3, 4, 5}, {9, 8, 7}}, p);
    auto u = (*unmerged)->generate({{1, 2, 3, 4, 5}, {9, 8, 7}}, p);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_TRUE(u.ok()) << u.status().to_string();
    EXPECT_EQ(m->generated, u->generated) << "cache " << static_cast<int>(cache);
  }
}

TEST(LoraUnmerged, RefusesWhatItCannotHoldNamingIt) {
  auto save = load_with_lora(unmerged_fixture("regex_patterns/adapter"), LoraMode::kUnmerged);  // modules_to_save
  ASSERT_FALSE(save.ok());
  EXPECT_NE(save.status().message().find("modules_to_save"), std::string::npos) << save.status().message();
  EXPECT_NE(save.status().message().find("--lora-mode merged"), std::string::npos) << save.status().message();
  auto head = load_with_lora(unmerged_fixture("target_lm_head/adapter"), LoraMode::kUnmerged);
  ASSERT_FALSE(head.ok());
  EXPECT_NE(head.status().message().find("lm_head"), std::string::npos) << head.status().message();
  EXPECT_NE(head.status().message().find("merged"), std::string::npos) << head.status().message();
  EXPECT_FALSE(parse_lora_mode("fused").ok());
  EXPECT_NE(parse_lora_mode("fused").status().message().find("--lora-mode"), std::string::npos);
  // serve's named adapters: names unique and non-empty, not beside a bare directory.
  EngineOptions o;
  o.model_dir = testing::fixtures_dir() + "/tiny-gqa2";
  o.lora_adapters = {{"a", unmerged_fixture("list_all/adapter")}, {"a", unmerged_fixture("list_all/adapter")}};
  auto twice = Engine::load(o);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("'a' is given twice"), std::string::npos) << twice.status().message();
  o.lora_adapters = {{"a", unmerged_fixture("list_all/adapter")}};
  o.lora_dir = unmerged_fixture("list_all/adapter");
  auto both = Engine::load(o);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("NAME=DIR"), std::string::npos) << both.status().message();
}

}  // namespace
}  // namespace dc
