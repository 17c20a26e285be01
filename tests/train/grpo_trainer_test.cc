// The Coupled-GRPO loop (src/train/grpo_trainer.h) on the tiny policy of the grpo fixtures, with rollouts
// from the engine's diffusion sampler: GRPO raises a reward the policy can earn (and a flipped reward
// lowers it), the first iteration of a round has ratio 1, the reference model is mixed into as
// 0.4·ref + 0.6·policy, and a stopped run resumed from its checkpoint equals the uninterrupted one bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "process.h"
#include "sampler/generate.h"
#include "train/grpo_trainer.h"
#include "train/rollout.h"
#include "temp_dir.h"
#include "train/tiny_grpo.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

class GrpoTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kGrpoDir / ".complete")) << "run `ctest -R grpo_fixtures` first";
    ctx_.pool = &pool_;
  }
  ThreadPool pool_{2};
  Context ctx_;
};

// GRPO pushes the policy toward what the reward pays for: the share of low tokens rises when they are
// rewarded and falls when the reward is flipped (a sign error in the loss or the advantages would turn
// both around).
TEST_F(GrpoTrainerTest, RaisesTheRewardItIsGiven) {
  for (const bool flip : {false, true}) {
    SCOPED_TRACE(flip ? "reward for high tokens" : "reward for low tokens");
    auto t = GrpoTrainer::create(tiny_grpo_options(16), ctx_, sampler_rollout(8, 4, 7, flip));
    ASSERT_TRUE(t.ok()) << t.status().message();
    GrpoTrainer& g = **t;
    ModelConfig cfg;
    {
      auto m = Model::load((kGrpoDir / "policy").string());
      ASSERT_TRUE(m.ok());
      cfg = (*m)->config();
    }
    const double before = policy_held_out_reward(*Model::from_weights(cfg, g.params().weights(), nullptr), ctx_, flip);
    while (g.steps_done() < 16) {
      auto s = g.step();
      ASSERT_TRUE(s.ok()) << s.status().message();
      if (s->iteration == 0) {
        EXPECT_EQ(s->clip_fraction, 0.0) << "the first iteration's ratio is exactly 1";
      }
    }
    const double after = policy_held_out_reward(*Model::from_weights(cfg, g.params().weights(), nullptr), ctx_, flip);
    std::printf("[ grpo     ] %s: held-out reward %.3f -> %.3f\n", flip ? "flipped" : "plain", before, after);
    EXPECT_GT(after, before + 0.15);
  }
}

TEST_F(GrpoTrainerTest, ReferenceModelIsMixedIntoEverySyncStep) {
  GrpoOptions o = tiny_grpo_options(2);
  o.ref_sync_steps = 1;
  auto t = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 3, false));
  ASSERT_TRUE(t.ok()) << t.status().message();
  GrpoTrainer& g = **t;
  const ModelParams::Tensor& r0 = g.ref_params().tensors()[1];
  const std::vector<float> before(r0.data, r0.data + r0.size);
  ASSERT_TRUE(g.step().ok());
  const ModelParams::Tensor& p = g.params().tensors()[1];
  int64_t differ = 0;
  for (int64_t j = 0; j < r0.size; ++j) {
    ASSERT_EQ(r0.data[j], (1.0f - 0.6f) * before[j] + 0.6f * p.data[j]) << j;
    differ += p.data[j] != before[j];
  }
  EXPECT_GT(differ, 0) << "the policy did not move";
}

// A run stopped after its first round and resumed from the checkpoint gives the weights, reference
// model and metrics of the uninterrupted run, bit for bit (with a sync every step, so the saved
// reference model matters).
// A rollout whose rewards come later (Rollout::await_rewards, as `grpo`'s overlapped scoring) trains exactly as
// one that returns them: the trainer awaits them once a round, after the round's log-probs; an error of the
// awaited scoring stops the step with its message.
TEST_F(GrpoTrainerTest, RewardsAwaitedAfterTheLogProbsEqualRewardsGiven) {
  int awaited = 0;
  const RolloutFn given = sampler_rollout(8, 4, 5, false);
  const RolloutFn later = [&](const Context& ctx, const Model& policy, int64_t round,
                              const std::vector<int64_t>& prompts) -> Result<Rollout> {
    DC_ASSIGN_OR_RETURN(Rollout r, given(ctx, policy, round, prompts));
    r.await_rewards = [&awaited, rewards = std::move(r.rewards), metrics = std::move(r.metrics)](Rollout& out) {
      ++awaited;
      out.rewards = rewards, out.metrics = metrics;
      return Status();
    };
    return r;
  };
  auto a = GrpoTrainer::create(tiny_grpo_options(4), ctx_, given);
  auto b = GrpoTrainer::create(tiny_grpo_options(4), ctx_, later);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int step = 0; step < 4; ++step) {
    auto sa = (*a)->step();
    auto sb = (*b)->step();
    ASSERT_TRUE(sa.ok() && sb.ok()) << sb.status().message();
    EXPECT_EQ(sa->reward_mean, sb->reward_mean);
    EXPECT_EQ(sa->loss, sb->loss);
  }
  EXPECT_EQ(awaited, 2) << "once a round";
  for (size_t i = 0; i < (*a)->params().tensors().size(); ++i) {
    const ModelParams::Tensor &x = (*a)->params().tensors()[i], &y = (*b)->params().tensors()[i];
    ASSERT_EQ(std::memcmp(x.data, y.data, x.size * sizeof(float)), 0) << x.name;
  }

  const RolloutFn failing = [&](const Context& ctx, const Model& policy, int64_t round,
                                const std::vector<int64_t>& prompts) -> Result<Rollout> {
    DC_ASSIGN_OR_RETURN(Rollout r, given(ctx, policy, round, prompts));
    r.rewards.clear();
    r.await_rewards = [](Rollout&) { return invalid_argument("reward program /x: exited with code 3"); };
    return r;
  };
  auto c = GrpoTrainer::create(tiny_grpo_options(4), ctx_, failing);
  ASSERT_TRUE(c.ok());
  auto sc = (*c)->step();
  ASSERT_FALSE(sc.ok());
  EXPECT_NE(sc.status().message().find("reward program /x: exited with code 3"), std::string::npos) << sc.status().message();
}

TEST_F(GrpoTrainerTest, ResumedRunIsBitIdentical) {
  GrpoOptions o = tiny_grpo_options(4);
  o.ref_sync_steps = 1;
  o.save_every = 1;
  o.recompute = true;
  const test::TempDir tmp("grpo_resume");
  o.out_dir = tmp.file("whole");
  auto whole = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  while ((*whole)->steps_done() < 4) ASSERT_TRUE((*whole)->step().ok());
  ASSERT_TRUE((*whole)->save().ok());

  o.out_dir = tmp.file("split");
  {
    auto first = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
    ASSERT_TRUE(first.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*first)->step().ok());  // step 3 is lost: the checkpoint is at 2
  }
  EXPECT_TRUE(fs::exists(fs::path(o.out_dir) / "checkpoint-000002" / "ref_model.safetensors"));
  auto refused = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--resume"), std::string::npos);
  o.resume = true;
  GrpoOptions changed = o;
  changed.loss.beta = 0.02;
  auto bad = GrpoTrainer::create(changed, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("beta=0.02"), std::string::npos) << bad.status().message();
  auto resumed = GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 11, false));
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ((*resumed)->steps_done(), 2);
  while ((*resumed)->steps_done() < 4) ASSERT_TRUE((*resumed)->step().ok());
  for (auto pair : {&GrpoTrainer::params, &GrpoTrainer::ref_params}) {
    const ModelParams& a = ((**whole).*pair)();
    const ModelParams& b = ((**resumed).*pair)();
    for (size_t i = 0; i < a.tensors().size(); ++i)
      ASSERT_EQ(0, std::memcmp(a.tensors()[i].data, b.tensors()[i].data, a.tensors()[i].size * sizeof(float)))
          << a.tensors()[i].name;
  }
  const auto& hw = (*whole)->history();
  const auto& hr = (*resumed)->history();
  ASSERT_EQ(hr.size(), 4u);  // two kept from metrics.jsonl, two run
  for (size_t i = 2; i < 4; ++i) EXPECT_EQ(hw[i].loss, hr[i].loss) << i;
  std::ifstream metrics(fs::path(o.out_dir) / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 4) << "the lost step 3 is not in metrics.jsonl twice";
  ASSERT_TRUE((*resumed)->save().ok());
  EXPECT_TRUE(fs::exists(fs::path(o.out_dir) / "reward.svg"));
}

TEST_F(GrpoTrainerTest, BadOptionsAreRefused) {
  GrpoOptions o = tiny_grpo_options(3);  // not whole rounds of 2 iterations
  EXPECT_FALSE(GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 1, false)).ok());
  o = tiny_grpo_options(2);
  o.grad_accum = 3;  // 16 completions in 3 micro-batches
  EXPECT_FALSE(GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 1, false)).ok());
  o = tiny_grpo_options(2);
  o.group_size = 1;
  EXPECT_FALSE(GrpoTrainer::create(o, ctx_, sampler_rollout(8, 4, 1, false)).ok());
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `diffucoder grpo` end to end on the tiny real-vocabulary checkpoint, rewarded by a user program: a run
// killed after step 3 and resumed (from its checkpoint at step 2) ends with the weights and reference
// model of the uninterrupted run, byte for byte; the progress line has every part the issue asks for.
TEST_F(GrpoTrainerTest, CliKilledRunResumesBitIdentical) {
  const fs::path model = fs::path(testing::fixtures_dir()) / "tiny-vocab";
  ASSERT_TRUE(fs::exists(model / "tokenizer.json"));
  const test::TempDir tmp("grpo_cli");
  const fs::path dir = tmp.path();
  std::ofstream(dir / "data.jsonl") << R"({"prompt": "Write f(x) returning x+1.", "tests": ["assert f(1) == 2"]})" "\n"
                                    << R"({"question": "Write g(x) returning 2*x.", "test_cases": ["assert g(2) == 4"]})" "\n";
  // The reward: how many letters 'e' the completion has (any score the policy's text moves).
  std::ofstream(dir / "reward.py") << "import json, sys\n"
                                      "for line in sys.stdin:\n"
                                      "    print(json.loads(line)['completion'].count('e'))\n";
  const std::string common = std::string(DC_BINARY_PATH) + " grpo --model " + model.string() + " --data " +
                             (dir / "data.jsonl").string() + " --num-generations 4 --max-completion-length 8 "
                             "--diffusion-steps 8 --steps 4 --lr 1e-2 --threads 2 --save-every 1 --code-weight 0 "
                             "--format-weight 0 --ref-sync-steps 1 --reward-program /usr/bin/python3 " +
                             (dir / "reward.py").string() + " --out ";
  const testing::RunResult whole = testing::run_command(common + (dir / "whole").string());
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  for (const char* part : {"step     4/4", "reward", "pass", "format", "kl", "clip", "loss", "tok/s", "ETA"})
    EXPECT_NE(whole.err.find(part), std::string::npos) << part << " in: " << whole.err;
  const testing::RunResult killed = testing::run_command(common + (dir / "split").string() + " --exit-after-step 3");
  ASSERT_EQ(killed.exit_code, 137) << killed.err;
  const testing::RunResult resumed = testing::run_command(common + (dir / "split").string() + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("from step 2"), std::string::npos) << resumed.err;
  for (const char* file : {"model.safetensors", "ref_model.safetensors", "optimizer.safetensors"}) {
    const std::string a = read_bytes(dir / "whole" / "checkpoint-000004" / file);
    EXPECT_FALSE(a.empty()) << file;
    EXPECT_TRUE(a == read_bytes(dir / "split" / "checkpoint-000004" / file)) << file << " differs after the resume";
  }
  EXPECT_NE(read_bytes(dir / "whole" / "checkpoint-000004" / "model.safetensors"),
            read_bytes(model / "model.safetensors")) << "the policy did not move";
  EXPECT_TRUE(fs::exists(dir / "split" / "reward.svg"));
}

}  // namespace
}  // namespace dc::train
