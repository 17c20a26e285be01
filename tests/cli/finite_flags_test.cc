// Probe finding 5 of issue 41: every real-number flag of every subcommand refuses NaN and infinities with
// a usage error naming the flag (exit 2). The flags are found from each subcommand's --help (CLI11 prints
// their type, FLOAT), so a flag added later is covered without editing this table. `train` prints its
// result as JSON (a non-finite loss would be null, never `nan`), and refuses a tampered trainer_state.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

// The long names of the options whose --help type is FLOAT, e.g. "  --lr FLOAT:NONNEGATIVE=1e-05 ...".
std::vector<std::string> float_flags_of(const std::string& command) {
  const testing::RunResult help = testing::run_binary(command + " --help");
  EXPECT_EQ(help.exit_code, 0) << help.err;
  std::vector<std::string> flags;
  std::istringstream lines(help.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name, type;
    if (!(words >> name >> type) || type.rfind("FLOAT", 0) != 0) continue;
    const size_t dashes = name.find("--");
    if (dashes != std::string::npos) flags.push_back(name.substr(dashes));
  }
  return flags;
}

TEST(FiniteFlags, EveryFloatFlagRefusesNanAndInfinity) {
  // The arguments each subcommand requires (values are checked before the files are opened).
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"train", "--model m --data d --out o"}, {"grpo", "--model m --data d --out o"},
      {"generate", "--model m --prompt-ids 1"}, {"serve", "--model m"},
      {"bench", "--shape tiny"},               {"grpo-loss", "--model m --batch b"},
      {"tokenize", "--text a"},                {"convert", "--model m --out o"},
      {"inspect", "--model m"}};
  int checked = 0;
  for (const auto& [command, required] : commands) {
    for (const std::string& flag : float_flags_of(command)) {
      for (const char* value : {"nan", "inf", "-inf"}) {  // (--flag=-inf: "-inf" alone would read as a flag)
        const std::string args = command + " " + required + " " + flag + "=" + value;
        const testing::RunResult r = testing::run_binary(args);
        EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
        EXPECT_NE(r.err.find(flag + ":"), std::string::npos) << args << "\nstderr: " << r.err;
        ++checked;
      }
    }
  }
  // The flags of the probe, at least: train's optimizer flags, grpo's too, and the decoding flags.
  EXPECT_GE(checked, 3 * 30) << "fewer FLOAT flags found than exist: has the --help format changed?";
}

TEST(FiniteFlags, TrainRefusesTheProbesNanFlagsAndPrintsJson) {
  const test::TempDir tmp("finite_train");
  const fs::path dir = tmp.path();
  {
    std::ofstream data(dir / "sft.jsonl");
    for (int i = 0; i < 4; ++i) data << R"({"prompt": "def f)" << i << R"((x):", "completion": " return x"})" << "\n";
  }
  const std::string common = "train --model " + testing::fixtures_dir() + "/tiny-vocab --data " +
                             (dir / "sft.jsonl").string() + " --steps 1 --seq-len 16 --batch-size 2 --threads 2 --quiet";
  for (const char* flag : {"--lr", "--beta1", "--max-grad-norm", "--weight-decay", "--adam-eps", "--min-lr-ratio"}) {
    const testing::RunResult r = testing::run_binary(common + " --out " + (dir / "nan").string() + " " + flag + " nan");
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(flag) + ": must be a finite number"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(dir / "nan" / "checkpoint-000001")) << "a NaN run saved a checkpoint";
  // A run's result line is JSON (the out path with a quote in it escaped).
  const fs::path out = dir / "a \"quoted\" out";
  const testing::RunResult ok = testing::run_binary(common + " --out '" + out.string() + "'");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  EXPECT_TRUE(j["final_loss"].is_number());
  EXPECT_EQ(j["out"], out.string());
  EXPECT_EQ(j["skipped_steps"], 0);
  // Probe finding 4 through the CLI: "cursor": -3 crashed `train --resume` with SIGSEGV.
  const fs::path state = out / "checkpoint-000001" / "trainer_state.json";
  nlohmann::json st;
  std::ifstream(state) >> st;
  st["cursor"] = -3;
  std::ofstream(state) << st.dump();
  const testing::RunResult tampered = testing::run_binary(common + " --out '" + out.string() + "' --resume");
  EXPECT_EQ(tampered.exit_code, 1) << tampered.err;
  EXPECT_NE(tampered.err.find(state.string() + ": field 'cursor'"), std::string::npos) << tampered.err;
}

}  // namespace
}  // namespace dc
