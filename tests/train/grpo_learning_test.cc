// The learning test of Coupled-GRPO, end to end through the binary: the tiny real-vocabulary
// checkpoint is fine-tuned by `diffucoder train` to answer "Write a Python function f(x) that returns
// x <op> <k>." in the chat format, then trained by `diffucoder grpo` with the recipe's code / code_format
// rewards (every test run in the sandbox), and its mean reward on prompts GRPO never saw rises.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "process.h"
#include "tokenizer/tokenizer.h"
#include "train/grpo_data.h"
#include "train/rewards.h"
#include "train/rollout.h"
#include "temp_dir.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

// Rollout settings shared by training and evaluation: an answer is 13 tokens and <|im_end|>.
constexpr int kNewTokens = 20;
constexpr int kDiffusionSteps = 10;
constexpr int kSeqLen = 33 + kNewTokens;  // the longest chat prompt of the task is 33 tokens

// Writes the three data files. Twelve phrasings of "return x plus one"; SFT sees, for each, the right
// answer `return x + 1` and a wrong one, `return x - 1` (the same format, one token apart), so the
// fine-tuned model writes each about half of the time. GRPO trains on 8 phrasings and is evaluated on
// the 4 others (held out from GRPO). One test a prompt, checking two values (one sandboxed run a
// completion: the runs are most of the test's time): the right answer scores 2.5 (code 2.0 + format 0.5),
// the wrong one 0.5, a constant that passes one of the values 0.5 too, and a broken format less.
void write_task_files(const fs::path& dir) {
  const char* phrasings[] = {"returns x plus one", "adds one to x", "increments x", "returns the successor of x",
                             "returns one more than x", "returns x increased by one", "returns the next integer after x",
                             "returns x + 1", "returns 1 + x", "computes x plus 1", "gives back x plus one", "adds 1 to x"};
  std::ofstream sft(dir / "sft.jsonl"), train(dir / "train.jsonl"), held(dir / "held.jsonl");
  for (int i = 0; i < 12; ++i) {
    const std::string question = std::string("Write a Python function f(x) that ") + phrasings[i] + ".";
    (i % 3 == 2 ? held : train) << "{\"prompt\": \"" << question
                                << "\", \"tests\": [\"assert f(1) == 2 and f(5) == 6\"]}\n";
    for (const char op : {'+', '-'})
      sft << "{\"messages\": [{\"role\": \"user\", \"content\": \"" << question
          << "\"}, {\"role\": \"assistant\", \"content\": \"```python\\ndef f(x):\\n    return x " << op
          << " 1\\n```\\n\"}]}\n";
  }
}

struct HeldOut {
  double reward = 0, pass_rate = 0, format_rate = 0;
};

// The mean reward (code 2.0 + code_format 0.5, as `grpo` scores) of 8 completions per held-out prompt
// from the checkpoint in `model_dir`, decoded as the rollouts are, with a seed training never used.
HeldOut held_out_reward(const fs::path& model_dir, const fs::path& data) {
  HeldOut h;
  auto model = Model::load(model_dir.string());
  EXPECT_TRUE(model.ok()) << model.status().message();
  auto tok = Tokenizer::from_file((model_dir / "tokenizer.json").string());
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!model.ok() || !tok.ok()) return h;
  auto ds = load_grpo_dataset(data.string(), *tok, {});
  EXPECT_TRUE(ds.ok()) << ds.status().message();
  if (!ds.ok()) return h;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<const GrpoExample*> examples;
  for (const GrpoExample& e : ds->examples) prompts.push_back(e.prompt_ids), examples.push_back(&e);
  RolloutOptions ro;
  ro.group_size = 8;
  ro.sampling = recipe_rollout_params((*model)->config());
  ro.sampling.max_new_tokens = kNewTokens;
  ro.sampling.steps = kDiffusionSteps;
  ro.im_end_id = tok->token_to_id("<|im_end|>").value_or(-1);
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  auto rb = generate_rollouts(ctx, **model, *tok, prompts, ro, /*seed=*/20261125);
  EXPECT_TRUE(rb.ok()) << rb.status().message();
  if (!rb.ok()) return h;
  auto inputs = reward_inputs(*rb, examples);
  EXPECT_TRUE(inputs.ok());
  if (!inputs.ok()) return h;
  auto scores = score_completions(*inputs, {});
  EXPECT_TRUE(scores.ok()) << scores.status().message();
  if (!scores.ok()) return h;
  for (double r : scores->total) h.reward += r;
  h.reward /= static_cast<double>(scores->total.size());
  h.pass_rate = scores->pass_rate(), h.format_rate = scores->format_rate();
  return h;
}

// GRPO on the 8 training phrasings must raise the mean reward on the 4 held-out ones by more than 0.5
// (measured 2026-11-29: 1.63 -> 2.50; 1.69 -> 2.50 with 16 completions a held-out prompt and two tests a
// prompt, twice the sandboxed runs), and so must GRPO of LoRA adapters over the frozen SFT model (1.63 ->
// 2.50 at --lr 1e-3). Measured with the settings of then: at --lr 1e-2 the first Adam step moves every
// adapter value by the rate and the policy collapses (1.69 -> 0.12); with the sign of the advantage term
// flipped on purpose the held-out reward falls (1.44 -> 0.35, BENCHMARKS.md); advantages that are all 0
// leave only the KL term, which holds the policy at the SFT checkpoint (reasoned, not run).
TEST(GrpoLearningTest, SftThenGrpoRaisesHeldOutRewardOfCodeTask) {
  const fs::path base = fs::path(testing::fixtures_dir()) / "tiny-vocab";
  ASSERT_TRUE(fs::exists(base / "tokenizer.json")) << "run `ctest -R reference_fixtures` first";
  const test::TempDir tmp("grpo_learn");
  const fs::path dir = tmp.path();
  write_task_files(dir);
  const std::string bin = DC_BINARY_PATH;
  const testing::RunResult sft = testing::run_command(
      bin + " train --model " + base.string() + " --data " + (dir / "sft.jsonl").string() + " --out " +
      (dir / "sft").string() + " --seq-len " + std::to_string(kSeqLen) +
      " --batch-size 8 --steps 150 --lr 1e-2 --warmup-steps 0 --threads 2 --quiet");
  ASSERT_EQ(sft.exit_code, 0) << sft.err;
  const fs::path sft_model = dir / "sft" / "checkpoint-000150";
  const testing::RunResult grpo = testing::run_command(
      bin + " grpo --model " + sft_model.string() + " --data " + (dir / "train.jsonl").string() + " --out " +
      (dir / "grpo").string() + " --num-generations 8 --prompts-per-round 3 --steps 10" +
      " --max-completion-length " + std::to_string(kNewTokens) + " --diffusion-steps " + std::to_string(kDiffusionSteps) +
      " --lr 1e-3 --lr-schedule constant --warmup-ratio 0 --weight-decay 0 --max-grad-norm 1 --precision f32" +
      " --threads 2 --quiet");
  ASSERT_EQ(grpo.exit_code, 0) << grpo.err;
  const HeldOut before = held_out_reward(sft_model, dir / "held.jsonl");
  const HeldOut after = held_out_reward(dir / "grpo" / "checkpoint-000010", dir / "held.jsonl");
  std::printf("[ grpo     ] held-out reward %.3f -> %.3f (pass rate %.3f -> %.3f, format rate %.3f -> %.3f)\n",
              before.reward, after.reward, before.pass_rate, after.pass_rate, before.format_rate, after.format_rate);
  EXPECT_GT(after.reward, before.reward + 0.5);

  // The same with LoRA adapters over the frozen SFT model (r 16 on every projection); the adapter of the last
  // step, merged by `convert --lora`, is the model evaluated.
  const testing::RunResult lora = testing::run_command(
      bin + " grpo --model " + sft_model.string() + " --data " + (dir / "train.jsonl").string() + " --out " +
      (dir / "grpo-lora").string() + " --num-generations 8 --prompts-per-round 3 --steps 10" +
      " --max-completion-length " + std::to_string(kNewTokens) + " --diffusion-steps " + std::to_string(kDiffusionSteps) +
      " --lr 1e-3 --lr-schedule constant --warmup-ratio 0 --weight-decay 0 --max-grad-norm 1 --precision f32" +
      " --lora-r 16 --lora-alpha 32 --threads 2 --quiet");
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  const fs::path merged = dir / "grpo-lora-merged";
  const testing::RunResult convert = testing::run_command(
      bin + " convert --model " + sft_model.string() + " --lora " + (dir / "grpo-lora" / "checkpoint-000010").string() +
      " --out " + merged.string() + " --quiet");
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  const HeldOut adapted = held_out_reward(merged, dir / "held.jsonl");
  std::printf("[ grpo lora] held-out reward %.3f -> %.3f (pass rate %.3f -> %.3f)\n", before.reward, adapted.reward,
              before.pass_rate, adapted.pass_rate);
  EXPECT_GT(adapted.reward, before.reward + 0.5);
}

}  // namespace
}  // namespace dc::train
