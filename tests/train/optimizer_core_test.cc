// OptimizerCore as a trainer other than SFT drives it (Coupled-GRPO's settings: gradients added by
// several loss calls, clipping at 0.2, AdamW with cosine-with-min-lr): a run saved (with an extra state
// file) and resumed is bit-identical to the uninterrupted one, and metrics.jsonl continues its curve.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/atomic_dir.h"
#include "io/checkpoint.h"
#include "train/optimizer_core.h"
#include "temp_dir.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;
const fs::path kModel = fs::path(DC_GRAD_FIXTURES_DIR) / "tiny-train";

OptimizerOptions grpo_like_options() {
  OptimizerOptions o;
  o.lr.schedule = LrSchedule::kCosine, o.lr.lr = 1e-2, o.lr.warmup_steps = 1, o.lr.total_steps = 6;
  o.lr.min_lr_ratio = 0.1;
  o.adam.weight_decay = 0.01;
  o.max_grad_norm = 0.2;
  return o;
}

OptimizerCore start_core() {
  auto ckpt = Checkpoint::open(kModel.string());
  EXPECT_TRUE(ckpt.ok());
  auto params = ModelParams::from_checkpoint(*ckpt);
  EXPECT_TRUE(params.ok());
  return OptimizerCore::start(ckpt->config(), std::move(*params), grpo_like_options());
}

// One optimizer step driven as a GRPO trainer would: two "loss calls" each ADD half of a gradient that
// depends on the weights and the step, then clip + AdamW.
OptimizerStepStats drive_one_step(OptimizerCore& core, ThreadPool& pool) {
  core.begin_step();
  const float* p = core.params().data();
  float* g = core.grads().data();
  const int64_t n = core.grads().n_values();
  std::fill_n(g, n, 0.0f);
  const double step = static_cast<double>(core.steps_done());
  for (int call = 0; call < 2; ++call)
    for (int64_t i = 0; i < n; ++i) g[i] += 0.5f * (0.05f * p[i] + 0.01f * static_cast<float>(std::sin(0.37 * i + step + call)));
  Context ctx;
  ctx.pool = &pool;
  return core.step(ctx);
}

bool same_bits(const ModelParams& a, const ModelParams& b) {
  return a.n_values() == b.n_values() && std::memcmp(a.data(), b.data(), a.n_values() * sizeof(float)) == 0;
}

TEST(OptimizerCore, ResumedRunIsBitIdenticalAndKeepsItsExtraFiles) {
  ASSERT_TRUE(fs::exists(fs::path(DC_GRAD_FIXTURES_DIR) / ".complete")) << "run `ctest -R grad_fixtures` first";
  ThreadPool pool(2);
  const test::TempDir tmp("optimizer_core");
  const fs::path out = tmp.file("out");

  OptimizerCore whole = start_core();
  std::vector<OptimizerStepStats> want;
  for (int i = 0; i < 5; ++i) want.push_back(drive_one_step(whole, pool));
  EXPECT_GT(want[0].grad_norm, 0.2) << "the test should exercise clipping";
  EXPECT_NEAR(want[4].lr, learning_rate(grpo_like_options().lr, 4), 0.0);

  OptimizerCore first = start_core();
  first.state().cursor = 17, first.state().seed = 5, first.state().options = "grpo test";
  ASSERT_TRUE(first.open_metrics(out.string()).ok());
  for (int i = 0; i < 3; ++i) {
    const OptimizerStepStats s = drive_one_step(first, pool);
    ASSERT_TRUE(first.append_metrics("{\"step\": " + std::to_string(s.step) + "}").ok());
  }
  auto dir = first.save(out.string(), kModel.string(), [](const std::string& tmp) {
    return write_text_file((fs::path(tmp) / "reference_policy.txt").string(), "frozen\n");
  });
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_EQ(fs::path(*dir).filename(), checkpoint_name(3));
  EXPECT_TRUE(fs::exists(fs::path(*dir) / "reference_policy.txt"));
  OptimizerStepStats unsaved = drive_one_step(first, pool);  // a step the kill loses
  ASSERT_TRUE(first.append_metrics("{\"step\": " + std::to_string(unsaved.step) + "}").ok());

  auto resumed = OptimizerCore::resume(*dir, grpo_like_options());
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ(resumed->steps_done(), 3);
  EXPECT_EQ(resumed->state().cursor, 17);
  EXPECT_EQ(resumed->state().seed, 5u);
  EXPECT_EQ(resumed->state().options, "grpo test");
  auto kept = resumed->open_metrics(out.string());
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 3u) << "the line of the lost step 4 is dropped";
  while (resumed->steps_done() < 5) {
    const OptimizerStepStats s = drive_one_step(*resumed, pool);
    EXPECT_EQ(s.lr, want[s.step - 1].lr);
    EXPECT_EQ(s.grad_norm, want[s.step - 1].grad_norm) << "step " << s.step;
  }
  EXPECT_TRUE(same_bits(resumed->params(), whole.params()));
  EXPECT_TRUE(same_bits(resumed->m(), whole.m()));
  EXPECT_TRUE(same_bits(resumed->v(), whole.v()));
  EXPECT_FALSE(same_bits(resumed->params(), start_core().params())) << "the steps changed the weights";

  auto missing = OptimizerCore::resume((out / "checkpoint-000009").string(), grpo_like_options());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("checkpoint-000009"), std::string::npos) << missing.status().message();
}

}  // namespace
}  // namespace dc::train
