// The GRPO learning test on the device (issue 36's target): `diffucoder grpo --device vulkan` (lavapipe in CI)
// from the same SFT checkpoint as the CPU's GrpoLearningTest (the fixture test GrpoLearningTest.SftCheckpoint,
// train/grpo_learning_test.cc) raises the held-out reward of the code task by more than 0.5 as the CPU run does;
// the held-out reward is measured on the CPU, as the CPU run's. DISABLED in ctest (reported "Not Run (Disabled)"):
// on lavapipe it takes over half an hour, mostly the device head's sampling over the 152k vocabulary in the
// rollouts, more than CI's whole budget. By hand, after the fixture (`ctest -R GrpoLearningTest.SftCheckpoint`):
//   build/tests/test_train_vulkan --gtest_also_run_disabled_tests --gtest_filter='GrpoLearningTest.*'
// (docs/grpo.md "Learning").
#include <gtest/gtest.h>

#include "temp_dir.h"
#include "train/grpo_learning.h"

namespace dc::train {
namespace {

using namespace learning;

TEST(GrpoLearningTest, DISABLED_OnVulkanRaisesHeldOutRewardOfCodeTask) {
  const test::TempDir tmp("grpo_learn_vulkan");
  // One prompt's 8 completions a generation and 4 completions a micro-batch: a rollout step's logits of a round's
  // 24 rows (24 · 20 positions × 152064 f32) and the loss rows' of 12 are more than lavapipe's largest storage
  // buffer (128 MiB).
  const HeldOut after = grpo_and_held_out("vulkan", fs::path(tmp.path()) / "grpo-vulkan",
                                          "--device vulkan --generation-batch-size 8 --grad-accum 6", false);
  EXPECT_GT(after.reward, held_out_before().reward + 0.5);
}

}  // namespace
}  // namespace dc::train
