// `--lora DIR` on the commands that load a model (generate, bench, serve, eval through the shared decoding flags)
// and `convert --lora`: a merged copy written atomically; a broken adapter is exit code 1 with the file and
// the field or tensor named. (The logits of merged models are checked in tests/lora/lora_test.cc.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fixtures.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using testing::run_binary;

std::string lora_fixture(const std::string& rel) {
  const char* d = std::getenv("DC_LORA_FIXTURES_DIR");
  return std::string(d != nullptr ? d : "") + "/" + rel;
}
const std::string kLoraBase = dc::testing::fixtures_dir() + "/tiny-gqa2";

TEST(CliLora, ConvertWritesTheMergedCheckpoint) {
  const test::TempDir tmp("lora_cli");
  const fs::path out = fs::path(tmp.path()) / "merged";
  auto r = run_binary("convert --model " + kLoraBase + " --lora " + lora_fixture("list_all/adapter") + " --out " +
                      out.string() + " --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("merged"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(out / "config.json"));
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  // generate --lora on the base gives the merged copy's tokens (greedy, f32).
  const std::string gen = " --prompt-ids 1,2,3,4,5 --max-new-tokens 8 --precision f32 --weight-cache off --threads 2 --quiet";
  auto with_lora = run_binary("generate --model " + kLoraBase + " --lora " + lora_fixture("list_all/adapter") + gen);
  auto copy = run_binary("generate --model " + out.string() + gen);
  ASSERT_EQ(with_lora.exit_code, 0) << with_lora.err;
  ASSERT_EQ(copy.exit_code, 0) << copy.err;
  EXPECT_FALSE(with_lora.out.empty());
  EXPECT_EQ(with_lora.out, copy.out);
  // q8 of the merged weights; GGUF output is refused (a second step).
  r = run_binary("convert --model " + kLoraBase + " --lora " + lora_fixture("list_all/adapter") + " --out " +
                 (fs::path(tmp.path()) / "q8").string() + " --weights q8 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_binary("convert --model " + kLoraBase + " --lora " + lora_fixture("list_all/adapter") + " --out " +
                 (fs::path(tmp.path()) / "x.gguf").string() + " --weights f32");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--lora"), std::string::npos) << r.err;
}

TEST(CliLora, BenchLoadsTheAdapter) {
  auto r = run_binary("bench --model " + kLoraBase + " --lora " + lora_fixture("regex_patterns/adapter") +
                      " --prompt-len 4 --new-tokens 4 --steps 2 --threads 2 --no-peak --weight-cache off");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("LoRA"), std::string::npos) << r.err;  // the load note
  r = run_binary("bench --shape tiny --lora " + lora_fixture("regex_patterns/adapter") + " --no-peak");
  EXPECT_NE(r.exit_code, 0);
}

TEST(CliLora, BrokenAdaptersExitOneNamingTheProblem) {
  const test::TempDir tmp("lora_cli_bad");
  struct Case {
    std::string args, adapter;
    std::vector<std::string> contains;
  };
  const std::string out = " --out " + (fs::path(tmp.path()) / "never").string();
  const std::vector<Case> cases = {
      {"convert --model " + kLoraBase + out, "bad/bad_shape", {"adapter_model.safetensors", "q_proj.lora_A.weight", "shape"}},
      {"convert --model " + kLoraBase + out, "bad/missing_weights", {"adapter_model.safetensors", "missing"}},
      {"generate --model " + kLoraBase + " --prompt-ids 1,2,3 --max-new-tokens 4", "bad/unknown_target",
       {"adapter_config.json", "field 'target_modules'", "qkv_proj"}},
      {"generate --model " + kLoraBase + " --prompt-ids 1,2,3 --max-new-tokens 4", "bad/not_lora",
       {"adapter_config.json", "field 'peft_type'"}},
      {"bench --model " + kLoraBase + " --no-peak", "bad/embedding_lora", {"lora_embedding_A"}},
      {"serve --model " + kLoraBase + " --port 0", "bad/dora", {"adapter_config.json", "field 'use_dora'"}},
      {"serve --model " + kLoraBase + " --port 0", "bad/no_such_adapter", {"no_such_adapter", "not a directory"}},
  };
  for (const Case& c : cases) {
    auto r = run_binary(c.args + " --lora " + lora_fixture(c.adapter));
    EXPECT_EQ(r.exit_code, 1) << c.args << " --lora " << c.adapter << "\n" << r.err;
    for (const std::string& s : c.contains) EXPECT_NE(r.err.find(s), std::string::npos) << c.adapter << ": " << s << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(fs::path(tmp.path()) / "never"));
}

// --lora-mode unmerged: the base kept as it is, the adapter added by every forward: the merged tokens (greedy,
// f32) in every cache mode the CLI offers; bench runs it.
TEST(CliLora, UnmergedGeneratesTheMergedTokensInEveryCacheMode) {
  const std::string gen = "generate --model " + kLoraBase + " --lora " + lora_fixture("list_all/adapter") +
                          " --prompt-ids 1,2,3,4,5 --max-new-tokens 8 --precision f32 --weight-cache off --threads 2 --quiet";
  for (const std::string cache : {"", " --cache prefix --block-length 4", " --cache dual --block-length 4",
                                   " --block-length 4", " --fast"}) {
    auto merged = run_binary(gen + cache);
    auto unmerged = run_binary(gen + cache + " --lora-mode unmerged");
    ASSERT_EQ(merged.exit_code, 0) << cache << merged.err;
    ASSERT_EQ(unmerged.exit_code, 0) << cache << unmerged.err;
    EXPECT_FALSE(merged.out.empty());
    EXPECT_EQ(merged.out, unmerged.out) << "cache flags:" << cache;
  }
  auto r = run_binary("bench --model " + kLoraBase + " --lora " + lora_fixture("list_all/adapter") +
                      " --lora-mode unmerged --prompt-len 4 --new-tokens 4 --steps 2 --threads 2 --no-peak --weight-cache off");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("unmerged"), std::string::npos) << r.err;  // the load note
}

// Bad --lora / --lora-mode values are named: usage errors (exit 2) before anything loads; what only the load
// can tell (an adapter unmerged cannot hold, a name given twice) exit 1.
TEST(CliLora, BadLoraFlagsAreNamed) {
  const std::string adapter = lora_fixture("list_all/adapter");
  struct Case {
    std::string args;
    int code;
    std::vector<std::string> contains;
  };
  const std::string gen = "generate --model " + kLoraBase + " --prompt-ids 1,2,3 --max-new-tokens 4";
  const std::string serve = "serve --model " + kLoraBase + " --port 0";
  const std::vector<Case> cases = {
      {gen + " --lora " + adapter + " --lora-mode fused", 2, {"--lora-mode", "fused", "merged | unmerged"}},
      {"bench --model " + kLoraBase + " --lora " + adapter + " --lora-mode x --no-peak", 2, {"--lora-mode", "'x'"}},
      {serve + " --lora a=", 2, {"--lora a=", "NAME=DIR"}},
      {serve + " --lora =" + adapter, 2, {"NAME=DIR"}},
      {serve + " --lora " + adapter + " --lora b=" + adapter, 2, {"--lora", "NAME=DIR"}},
      {serve + " --lora a=" + adapter + " --lora-mode merged", 2, {"--lora-mode merged", "unmerged"}},
      {serve + " --lora a=" + adapter + " --lora a=" + adapter, 1, {"'a' is given twice"}},
      {serve + " --lora a=" + lora_fixture("regex_patterns/adapter"), 1, {"modules_to_save", "merged"}},
  };
  for (const Case& c : cases) {
    auto r = run_binary(c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    for (const std::string& s : c.contains) EXPECT_NE(r.err.find(s), std::string::npos) << c.args << ": " << s << "\n" << r.err;
  }
}

// `train --lora-r`: a PEFT adapter as the checkpoint, which `generate --lora` then loads; a bad --lora-targets is
// refused by the trainer (exit code 1, as its other refused settings) naming the flag and the entry.
TEST(CliLora, TrainWritesAnAdapterThatGenerateLoads) {
  const test::TempDir tmp("lora_train_cli");
  const fs::path dir = tmp.path();
  {
    std::ofstream data(dir / "sft.jsonl");
    for (int i = 0; i < 4; ++i) data << R"({"prompt": "def f)" << i << R"((x):", "completion": " return x"})" << "\n";
  }
  const std::string model = testing::fixtures_dir() + "/tiny-vocab";
  const std::string common = "train --model " + model + " --data " + (dir / "sft.jsonl").string() +
                             " --steps 2 --seq-len 16 --batch-size 2 --threads 2 --lr 1e-2 --out " + (dir / "out").string();
  auto r = run_binary(common + " --lora-r 4 --lora-alpha 8 --lora-targets q_proj,v_proj,down_proj --lora-dropout 0.05");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("LoRA r=4"), std::string::npos) << r.err;
  const fs::path ckpt = dir / "out" / "checkpoint-000002";
  EXPECT_TRUE(fs::exists(ckpt / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt / "model.safetensors"));
  auto gen = run_binary("generate --model " + model + " --lora " + ckpt.string() +
                        " --prompt-ids 1,2,3 --max-new-tokens 4 --precision f32 --weight-cache off --threads 2 --quiet");
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  r = run_binary(common + "2 --lora-r 4 --lora-targets q_proj,qkv_proj");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--lora-targets"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("qkv_proj"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dc
