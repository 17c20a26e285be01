// The facade's GrpoTrainer (include/diffucoder/diffucoder.h), which `diffucoder grpo` is built on: each bad
// field refused naming it; a short run on the tiny real-vocabulary checkpoint, rewarded by a user program,
// writes the checkpoint and metrics of the CLI given the same options, byte for byte; a run stopped after its
// first round and resumed equals the uninterrupted one.
#include <gtest/gtest.h>

#include <diffucoder/diffucoder.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fixtures.h"
#include "process.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

// Two prompts with tests, and a reward program scoring a completion by its letters 'e' (a score the policy's
// text moves); returns the config of a 4-step run (2 rounds of 2 iterations) over them, without out_dir.
diffucoder::GrpoConfig tiny_grpo_config(const fs::path& dir) {
  std::ofstream(dir / "data.jsonl") << R"({"prompt": "Write f(x) returning x+1.", "tests": ["assert f(1) == 2"]})" "\n"
                                    << R"({"question": "Write g(x) returning 2*x.", "test_cases": ["assert g(2) == 4"]})" "\n";
  std::ofstream(dir / "reward.py") << "import json, sys\n"
                                      "for line in sys.stdin:\n"
                                      "    print(json.loads(line)['completion'].count('e'))\n";
  diffucoder::GrpoConfig c;
  c.model_dir = dc::testing::fixtures_dir() + "/tiny-vocab";
  c.data_path = (dir / "data.jsonl").string();
  c.num_generations = 4, c.max_completion_length = 8, c.diffusion_steps = 8, c.steps = 4, c.lr = 1e-2;
  c.threads = 2, c.save_every = 1, c.code_weight = 0, c.format_weight = 0, c.ref_sync_steps = 1;
  c.reward_program = {"/usr/bin/python3", (dir / "reward.py").string()};
  return c;
}

// The same options as `diffucoder grpo` flags.
std::string tiny_grpo_flags(const diffucoder::GrpoConfig& c) {
  return "grpo --model " + c.model_dir + " --data " + c.data_path + " --num-generations 4 --max-completion-length 8 "
         "--diffusion-steps 8 --steps 4 --lr 1e-2 --threads 2 --save-every 1 --code-weight 0 --format-weight 0 "
         "--ref-sync-steps 1 --quiet --reward-program " + c.reward_program[0] + " " + c.reward_program[1] + " --out " +
         c.out_dir;
}

std::string grpo_file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// metrics.jsonl's lines without their timings (wall-clock seconds and rates), as JSON text.
std::vector<std::string> untimed_metrics(const fs::path& out) {
  std::vector<std::string> lines;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (const char* timing : {"rollout_seconds", "score_seconds", "train_seconds", "seconds", "rollout_tokens_per_s",
                               "generate_seconds", "reward_seconds", "reward_wait_seconds"})
      j.erase(timing);
    lines.push_back(j.dump());
  }
  return lines;
}

// Steps `t` to `until`, returning the stats.
std::vector<diffucoder::GrpoStepStats> grpo_steps(diffucoder::GrpoTrainer& t, int64_t until) {
  std::vector<diffucoder::GrpoStepStats> out;
  while (t.steps_done() < until) {
    auto s = t.step();
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) break;
    out.push_back(*s);
  }
  return out;
}

TEST(ApiGrpo, BadFieldsRefusedNamingTheField) {
  const dc::test::TempDir tmp("api_grpo_fields");
  const fs::path dir = tmp.path();
  const diffucoder::GrpoConfig c = tiny_grpo_config(dir);
  ASSERT_TRUE(diffucoder::check_grpo_config(c).ok()) << diffucoder::check_grpo_config(c).to_string();
  auto refused = [&](const diffucoder::GrpoConfig& bad, const std::string& field) {
    const diffucoder::Status checked = diffucoder::check_grpo_config(bad);
    EXPECT_EQ(checked.code(), diffucoder::StatusCode::kInvalidArgument) << field;
    if (field.back() == ':')  // "field: must be ..."
      EXPECT_EQ(checked.message().rfind(field, 0), 0u) << checked.message();
    else
      EXPECT_NE(checked.message().find(field), std::string::npos) << checked.message();
    auto t = diffucoder::GrpoTrainer::create(bad);
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_EQ(t.status().message(), checked.message());  // create checks the same, first
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  using Change = std::function<void(diffucoder::GrpoConfig&)>;
  const std::vector<std::pair<std::string, Change>> cases = {
      {"num_generations:", [](auto& g) { g.num_generations = 1; }},  // leave-one-out advantages need two
      {"steps:", [](auto& g) { g.steps = -1; }},
      {"grad_accum:", [](auto& g) { g.grad_accum = 0; }},
      {"top_p:", [](auto& g) { g.top_p = 1.5f; }},
      {"temperature:", [](auto& g) { g.temperature = -1; }},
      {"diffusion_steps:", [](auto& g) { g.diffusion_steps = 0; }},
      {"max_completion_length:", [](auto& g) { g.max_completion_length = 0; }},
      {"beta:", [](auto& g) { g.beta = -0.1; }},
      {"epsilon:", [&](auto& g) { g.epsilon = nan; }},
      {"beta2:", [](auto& g) { g.beta2 = 1.0; }},
      {"warmup_ratio:", [](auto& g) { g.warmup_ratio = 2; }},
      {"ref_mixup_alpha:", [](auto& g) { g.ref_mixup_alpha = -1; }},
      {"test_timeout:", [](auto& g) { g.test_timeout = 0; }},
      {"reward_weight:", [&](auto& g) { g.reward_weight = nan; }},
      {"lr_schedule:", [](auto& g) { g.lr_schedule = "step"; }},
      {"precision:", [](auto& g) { g.precision = "fp8"; }},
      {"--lora-targets:", [](auto& g) { g.lora_r = 4, g.lora_targets = "q_proj,attn"; }},
      {"reward_program", [](auto& g) { g.reward_program.clear(); }},  // and code_weight, format_weight 0
      {"generation_batch_size:", [](auto& g) { g.generation_batch_size = 6; }},  // not whole groups of 4
      {"generation_batch_size:", [](auto& g) { g.generation_batch_size = -4; }},
  };
  for (const auto& [field, change] : cases) {
    diffucoder::GrpoConfig bad = c;
    change(bad);
    refused(bad, field);
  }
  diffucoder::GrpoConfig bad = c;
  // A file's error names it; structure that needs the data (whole rounds) is checked by create.
  bad.data_path = (dir / "missing.jsonl").string();
  auto t = diffucoder::GrpoTrainer::create(bad);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("missing.jsonl"), std::string::npos) << t.status().message();
  bad = c, bad.steps = 3;  // not whole rounds of num_iterations 2
  t = diffucoder::GrpoTrainer::create(bad);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--num-iterations"), std::string::npos) << t.status().message();
}

// The facade's run equals `diffucoder grpo` with the same options: the checkpoint's policy, reference model
// and optimizer state byte for byte, metrics.jsonl's numbers but the timings. A facade run stopped after its
// first round (checkpoint-000002) and resumed by a new GrpoTrainer ends the same.
TEST(ApiGrpo, RunEqualsTheCliAndResumes) {
  const dc::test::TempDir tmp("api_grpo_run");
  const fs::path dir = tmp.path();
  diffucoder::GrpoConfig c = tiny_grpo_config(dir);
  c.out_dir = (dir / "cli").string();
  const dc::testing::RunResult cli = dc::testing::run_binary(tiny_grpo_flags(c));
  ASSERT_EQ(cli.exit_code, 0) << cli.err;

  c.out_dir = (dir / "api").string();
  auto whole = diffucoder::GrpoTrainer::create(c);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ((*whole)->steps(), 4);
  EXPECT_EQ((*whole)->prompts(), 2);
  EXPECT_EQ((*whole)->sandbox_note(), "");  // no code or format reward
  const std::vector<diffucoder::GrpoStepStats> stats = grpo_steps(**whole, 4);
  ASSERT_EQ(stats.size(), 4u);
  EXPECT_EQ(stats[0].round, 0);
  EXPECT_EQ(stats[1].iteration, 1);
  EXPECT_EQ(stats[3].round, 1);
  EXPECT_TRUE(stats[0].metric("pass_rate").has_value());
  EXPECT_FALSE(stats[0].metric("no_such_metric").has_value());
  EXPECT_GT(stats[0].rollout_tokens, 0);
  // The one reward on, unweighted over the round's 4 completions: with weight 1 the total's mean.
  ASSERT_EQ(stats[0].rewards.size(), 1u);
  EXPECT_EQ(stats[0].rewards[0].name, "reward_program");
  EXPECT_EQ(stats[0].rewards[0].n, 4);
  EXPECT_DOUBLE_EQ(stats[0].rewards[0].mean, stats[0].reward_mean);
  ASSERT_EQ(stats[1].rewards.size(), 1u);  // the round's second iteration keeps its round's rewards
  EXPECT_EQ(stats[1].rewards[0].mean, stats[0].rewards[0].mean);
  ASSERT_TRUE((*whole)->save().ok());
  auto ranks = (*whole)->gather_rank_stats();
  ASSERT_TRUE(ranks.ok()) << ranks.status().to_string();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_GT((*ranks)[0].master_weight_bytes, 0);
  ASSERT_EQ((*whole)->history().size(), 4u);
  EXPECT_EQ((*whole)->history().back().reward_mean, stats.back().reward_mean);

  c.out_dir = (dir / "split").string();
  {
    auto first = diffucoder::GrpoTrainer::create(c);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    ASSERT_EQ(grpo_steps(**first, 2).size(), 2u);  // save_every 1: checkpoint-000002 at the round's end
  }
  c.resume = true;
  auto resumed = diffucoder::GrpoTrainer::create(c);
  ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
  EXPECT_EQ((*resumed)->steps_done(), 2);
  ASSERT_EQ(grpo_steps(**resumed, 4).size(), 2u);
  ASSERT_TRUE((*resumed)->save().ok());
  EXPECT_EQ((*resumed)->history().size(), 4u);  // metrics.jsonl's two steps, then this object's

  const std::vector<std::string> cli_metrics = untimed_metrics(dir / "cli");
  ASSERT_EQ(cli_metrics.size(), 4u);
  for (const char* run : {"api", "split"}) {
    SCOPED_TRACE(run);
    for (const char* file : {"model.safetensors", "ref_model.safetensors", "optimizer.safetensors"}) {
      const std::string expected = grpo_file_bytes(dir / "cli" / "checkpoint-000004" / file);
      ASSERT_FALSE(expected.empty()) << file;
      EXPECT_TRUE(expected == grpo_file_bytes(dir / run / "checkpoint-000004" / file)) << file << " differs";
    }
    EXPECT_EQ(untimed_metrics(dir / run), cli_metrics);
  }
  EXPECT_NE(grpo_file_bytes(dir / "api" / "checkpoint-000004" / "model.safetensors"),
            grpo_file_bytes(fs::path(c.model_dir) / "model.safetensors")) << "the policy did not move";
}

// A round generated in chunks of one prompt (generation_batch_size = num_generations) with each chunk's rewards
// scored on a worker thread (overlap_rewards, the default) ends as `diffucoder grpo --no-overlap-rewards`, which
// scores each chunk before going on: the same rewards in the same order, so the same metrics (but the timings)
// and the same checkpoint bytes after two rounds. The code and format rewards are on beside the program's.
TEST(ApiGrpo, OverlappedRewardsEqualTheSequentialOnes) {
  const dc::test::TempDir tmp("api_grpo_overlap");
  const fs::path dir = tmp.path();
  diffucoder::GrpoConfig c = tiny_grpo_config(dir);
  c.prompts_per_round = 2, c.generation_batch_size = 4, c.code_weight = 2.0, c.format_weight = 0.5, c.reward_workers = 2;
  c.save_every = 0;
  c.out_dir = (dir / "cli").string();
  std::string flags = tiny_grpo_flags(c);
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"--code-weight 0 --format-weight 0", "--code-weight 2 --format-weight 0.5"},
                                 {"--save-every 1", "--save-every 0"}})
    flags.replace(flags.find(from), from.size(), to);
  const dc::testing::RunResult cli = dc::testing::run_binary(
      flags + " --prompts-per-round 2 --generation-batch-size 4 --reward-workers 2 --no-overlap-rewards");
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  c.out_dir = (dir / "api").string();
  auto t = diffucoder::GrpoTrainer::create(c);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::vector<diffucoder::GrpoStepStats> stats = grpo_steps(**t, 4);
  ASSERT_EQ(stats.size(), 4u);
  EXPECT_TRUE(stats[0].metric("reward_wait_seconds").has_value());
  ASSERT_EQ(stats[0].rewards.size(), 3u);  // code, code_format, the program's: each over the round's 8 completions
  EXPECT_EQ(stats[0].rewards[2].n, 8);
  ASSERT_TRUE((*t)->save().ok());
  for (const char* file : {"model.safetensors", "ref_model.safetensors", "optimizer.safetensors"}) {
    const std::string expected = grpo_file_bytes(dir / "cli" / "checkpoint-000004" / file);
    ASSERT_FALSE(expected.empty()) << file;
    EXPECT_TRUE(expected == grpo_file_bytes(dir / "api" / "checkpoint-000004" / file)) << file << " differs";
  }
  const std::vector<std::string> cli_metrics = untimed_metrics(dir / "cli");
  ASSERT_EQ(cli_metrics.size(), 4u);
  EXPECT_EQ(untimed_metrics(dir / "api"), cli_metrics);
}

}  // namespace
