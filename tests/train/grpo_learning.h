// The GRPO learning tests' shared parts (grpo_learning_test.cc on the CPU, vulkan/grpo_learning_vulkan_test.cc on
// the device): the code task's data files, the SFT checkpoint they all start from (made once per ctest run by the
// fixture test GrpoLearningTest.SftCheckpoint into the build directory), the `grpo` command line, and the held-out
// reward of a checkpoint.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "process.h"
#include "tokenizer/tokenizer.h"
#include "train/grpo_data.h"
#include "train/rewards.h"
#include "train/rollout.h"

namespace dc::train::learning {

namespace fs = std::filesystem;

// Rollout settings shared by training and evaluation: an answer is 13 tokens and <|im_end|>.
constexpr int kNewTokens = 20;
constexpr int kDiffusionSteps = 10;
constexpr int kSeqLen = 33 + kNewTokens;  // the longest chat prompt of the task is 33 tokens
constexpr int kSftSteps = 150;

// Where the fixture test writes the task's files, the SFT run and the SFT checkpoint's held-out reward.
inline fs::path task_dir() { return DC_GRPO_LEARNING_DIR; }
inline fs::path sft_model() { return task_dir() / "sft" / "checkpoint-000150"; }
inline fs::path before_file() { return task_dir() / "held_out_before.txt"; }

// Writes the three data files. Twelve phrasings of "return x plus one"; SFT sees, for each, the right
// answer `return x + 1` and a wrong one, `return x - 1` (the same format, one token apart), so the
// fine-tuned model writes each about half of the time. GRPO trains on 8 phrasings and is evaluated on
// the 4 others (held out from GRPO). One test a prompt, checking two values (one sandboxed run a
// completion: the runs are most of the test's time): the right answer scores 2.5 (code 2.0 + format 0.5),
// the wrong one 0.5, a constant that passes one of the values 0.5 too, and a broken format less.
inline void write_task_files(const fs::path& dir) {
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
// from the checkpoint in `model_dir`, decoded as the rollouts are (on the CPU), with a seed training never used.
inline HeldOut held_out_reward(const fs::path& model_dir) {
  HeldOut h;
  auto model = Model::load(model_dir.string());
  EXPECT_TRUE(model.ok()) << model.status().message();
  auto tok = Tokenizer::from_file((model_dir / "tokenizer.json").string());
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!model.ok() || !tok.ok()) return h;
  auto ds = load_grpo_dataset((task_dir() / "held.jsonl").string(), *tok, {});
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

// The SFT checkpoint's held-out reward, as the fixture test wrote it; all zeros (and a failure) without it.
inline HeldOut held_out_before() {
  HeldOut h;
  std::ifstream in(before_file());
  EXPECT_TRUE(in >> h.reward >> h.pass_rate >> h.format_rate)
      << before_file() << " is missing: run the fixture first (`ctest -R GrpoLearningTest` runs it)";
  return h;
}

// `diffucoder grpo` of the SFT checkpoint on the 8 training phrasings, 10 steps, into `out`, with `extra` flags.
inline std::string grpo_command(const fs::path& out, const std::string& extra) {
  return std::string(DC_BINARY_PATH) + " grpo --model " + sft_model().string() + " --data " +
         (task_dir() / "train.jsonl").string() + " --out " + out.string() +
         " --num-generations 8 --prompts-per-round 3 --steps 10 --max-completion-length " + std::to_string(kNewTokens) +
         " --diffusion-steps " + std::to_string(kDiffusionSteps) +
         " --lr 1e-3 --lr-schedule constant --warmup-ratio 0 --weight-decay 0 --max-grad-norm 1 --precision f32" +
         " --threads 2 --quiet " + extra;
}

// Runs `grpo_command(out, extra)` and returns the held-out reward of its last checkpoint (merged with the SFT
// model by `convert --lora` when `lora`), printed beside the SFT checkpoint's under `label`.
inline HeldOut grpo_and_held_out(const std::string& label, const fs::path& out, const std::string& extra, bool lora) {
  const testing::RunResult grpo = testing::run_command(grpo_command(out, extra));
  EXPECT_EQ(grpo.exit_code, 0) << grpo.err;
  if (grpo.exit_code != 0) return {};
  fs::path model = out / "checkpoint-000010";
  if (lora) {
    const fs::path merged = out.string() + "-merged";
    const testing::RunResult convert = testing::run_command(std::string(DC_BINARY_PATH) + " convert --model " +
                                                            sft_model().string() + " --lora " + model.string() +
                                                            " --out " + merged.string() + " --quiet");
    EXPECT_EQ(convert.exit_code, 0) << convert.err;
    if (convert.exit_code != 0) return {};
    model = merged;
  }
  const HeldOut before = held_out_before(), after = held_out_reward(model);
  std::printf("[ %-9s] held-out reward %.3f -> %.3f (pass rate %.3f -> %.3f, format rate %.3f -> %.3f)\n", label.c_str(),
              before.reward, after.reward, before.pass_rate, after.pass_rate, before.format_rate, after.format_rate);
  return after;
}

}  // namespace dc::train::learning
