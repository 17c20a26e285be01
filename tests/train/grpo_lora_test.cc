// Coupled-GRPO with LoRA adapters over the frozen tiny policy (GrpoOptions::lora): the adapters learn what the
// reward pays for (and the flipped reward the opposite); the reference model starts as the base itself (the
// first step's KL is zero) and its adapter copy is mixed as 0.4·ref + 0.6·policy; a stopped run resumes bit for
// bit from its PEFT checkpoint; the base's weights never change.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "lora/adapter.h"
#include "temp_dir.h"
#include "train/tiny_grpo.h"

namespace dc::train {
namespace {

GrpoOptions lora_grpo_options(int64_t steps) {
  GrpoOptions o = tiny_grpo_options(steps);
  o.lora.r = 8, o.lora.alpha = 16;
  o.lr.lr = 2e-2;
  return o;
}

// The held-out reward of the base plus `adapters`.
double adapted_reward(const LoraParams& adapters, const Context& ctx, bool flip) {
  auto base = Model::load((kGrpoDir / "policy").string());
  EXPECT_TRUE(base.ok());
  (*base)->set_lora(&adapters.weights());
  return policy_held_out_reward(**base, ctx, flip);
}

class GrpoLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kGrpoDir / ".complete")) << "run `ctest -R grpo_fixtures` first";
    ctx_.pool = &pool_;
  }
  ThreadPool pool_{2};
  Context ctx_;
};

TEST_F(GrpoLoraTest, AdaptersRaiseTheRewardTheyAreGiven) {
  for (const bool flip : {false, true}) {
    SCOPED_TRACE(flip ? "reward for high tokens" : "reward for low tokens");
    auto t = GrpoTrainer::create(lora_grpo_options(16), ctx_, sampler_rollout(8, 4, 7, flip));
    ASSERT_TRUE(t.ok()) << t.status().message();
    GrpoTrainer& g = **t;
    ASSERT_NE(g.lora_core(), nullptr);
    EXPECT_EQ(g.params().n_values(), 0) << "a LoRA run holds no f32 copy of the base";
    const double before = adapted_reward(g.lora_core()->params(), ctx_, flip);
    while (g.steps_done() < 16) {
      auto s = g.step();
      ASSERT_TRUE(s.ok()) << s.status().message();
      if (s->step == 1) {
        EXPECT_EQ(s->kl, 0.0) << "the reference model (base + B = 0) is the starting policy";
      }
    }
    const double after = adapted_reward(g.lora_core()->params(), ctx_, flip);
    std::printf("[ grpo lora] %s: held-out reward %.3f -> %.3f\n", flip ? "flipped" : "plain", before, after);
    EXPECT_GT(after, before + 0.15);
  }
}

TEST_F(GrpoLoraTest, ReferenceAdaptersAreMixedAndAStoppedRunResumesBitForBit) {
  GrpoOptions o = lora_grpo_options(4);
  o.ref_sync_steps = 1, o.save_every = 1, o.recompute = true;
  o.lora.dropout = 0.1f;
  const test::TempDir tmp("grpo_lora_resume");
  o.out_dir = tmp.file("whole");
  auto whole = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  {  // the sync: ref ← 0.4·ref + 0.6·policy over the adapters' values
    const LoraParams& ref = *(*whole)->ref_adapters();
    const std::vector<float> before(ref.data(), ref.data() + ref.n_values());
    ASSERT_TRUE((*whole)->step().ok());
    const LoraParams& p = (*whole)->lora_core()->params();
    int64_t moved = 0;
    for (int64_t j = 0; j < ref.n_values(); ++j) {
      ASSERT_EQ(ref.data()[j], (1.0f - 0.6f) * before[j] + 0.6f * p.data()[j]) << j;
      moved += p.data()[j] != before[j];
    }
    EXPECT_GT(moved, 0) << "the adapters did not move";
  }
  while ((*whole)->steps_done() < 4) ASSERT_TRUE((*whole)->step().ok());

  o.out_dir = tmp.file("split");
  {
    auto first = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
    ASSERT_TRUE(first.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*first)->step().ok());  // step 3 is lost: the checkpoint is at 2
  }
  const std::filesystem::path ckpt = std::filesystem::path(o.out_dir) / "checkpoint-000002";
  EXPECT_TRUE(std::filesystem::exists(ckpt / "ref_adapter_model.safetensors"));
  EXPECT_TRUE(open_lora_adapter(ckpt.string()).ok()) << "the checkpoint is a PEFT adapter";
  o.resume = true;
  GrpoOptions full = o;  // a full run cannot continue a LoRA one
  full.lora = LoraSpec{};
  auto refused = GrpoTrainer::create(full, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("LoRA"), std::string::npos) << refused.status().message();
  auto resumed = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ((*resumed)->steps_done(), 2);
  while ((*resumed)->steps_done() < 4) ASSERT_TRUE((*resumed)->step().ok());
  for (auto get : {+[](const GrpoTrainer& g) { return &g.lora_core()->params(); },
                   +[](const GrpoTrainer& g) { return g.ref_adapters(); }}) {
    const LoraParams& a = *get(**whole);
    const LoraParams& b = *get(**resumed);
    ASSERT_EQ(a.n_values(), b.n_values());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.n_values() * sizeof(float)));
  }
  for (size_t i = 2; i < 4; ++i) EXPECT_EQ((*whole)->history()[i].loss, (*resumed)->history()[i].loss) << i;
}

}  // namespace
}  // namespace dc::train
