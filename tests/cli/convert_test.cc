// `diffucoder convert` end to end: q8 / q4 copies of a tiny fixture that generate, inspect and leave no
// temporary directory; progress on stderr; errors (existing output, missing model, bad options).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fixtures.h"
#include "process.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

using testing::run_binary;

bool has_tmp_leftover(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

const std::string kVocabModel = dc::testing::fixtures_dir() + "/tiny-vocab";
const std::string kSmallModel = dc::testing::fixtures_dir() + "/tiny-gqa1";

TEST(Convert, QuantizedCopiesGenerateAndInspect) {
  const test::TempDir tmp("convert_ok");
  const fs::path dir = tmp.path();
  for (const char* format : {"q8", "q4"}) {
    const fs::path out = dir / format;
    // --group-size 32: the fixture's 32-column matrices (at the default 128 they would stay as stored).
    const std::string group = std::string(format) == "q4" ? " --group-size 32" : "";
    auto r = run_binary("convert --model " + kVocabModel + " --out " + out.string() + " --weights " + format + group);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("/27]"), std::string::npos) << "progress per tensor on stderr: " << r.err;
    // A rate over a few milliseconds is noise (issue 23: "11919284.8 MB/s"): shown only after 50 ms.
    for (size_t at = r.err.find(" MB/s"); at != std::string::npos; at = r.err.find(" MB/s", at + 1)) {
      const size_t begin = r.err.find_last_of(' ', at - 1);
      EXPECT_LT(std::stod(r.err.substr(begin + 1, at - begin - 1)), 1e5) << r.err;
    }
    EXPECT_NE(r.err.find("wrote " + out.string()), std::string::npos) << r.err;
    // The duration: "N ms" under a second, "X.Y s" from one second on (which one depends on the machine's load).
    const size_t in = r.err.rfind(" GB in ");
    ASSERT_NE(in, std::string::npos) << r.err;
    std::istringstream took(r.err.substr(in + 7));
    double value = -1;
    std::string unit;
    took >> value >> unit;
    EXPECT_TRUE((unit == "ms" && value >= 0 && value < 1000) || (unit == "s" && value >= 1.0))
        << "a conversion under a second is timed in ms, a longer one in s: " << r.err;
    EXPECT_FALSE(has_tmp_leftover(dir));
    for (const char* file : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
      EXPECT_TRUE(fs::exists(out / file)) << file;
    const auto config = dc::testing::load_json((out / "config.json").string());
    EXPECT_EQ(config["quantization"]["format"], format);
    EXPECT_EQ(config["quantization"]["quantized_by"], "diffucoder");
    EXPECT_EQ(config["quantization"]["group_size"], std::string(format) == "q4" ? 32 : 0);
    EXPECT_EQ(config["hidden_size"], dc::testing::load_json(kVocabModel + "/config.json")["hidden_size"]);

    auto gen = run_binary("generate --model " + out.string() + " --prompt 'def add(a, b):' --max-new-tokens 8 --steps 4 --json --quiet");
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    EXPECT_EQ(nlohmann::json::parse(gen.out)["token_ids"].size(), 8u);
    auto inspect = run_binary("inspect --model " + out.string() + " --json");
    ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
    const auto dtypes = nlohmann::json::parse(inspect.out)["tensor_dtypes"];
    EXPECT_TRUE(dtypes.contains(std::string(format) == "q8" ? "I8" : "U8")) << dtypes.dump();
  }
}

TEST(Convert, ErrorsNameTheProblem) {
  const test::TempDir tmp("convert_bad");
  const fs::path dir = tmp.path();
  fs::create_directories(dir / "exists");
  struct Case {
    std::string args, expect_in_error;
    int exit_code;
  };
  const std::string out = " --out " + (dir / "new").string();
  const std::vector<Case> cases = {
      {"convert --model " + kSmallModel + " --out " + (dir / "exists").string() + " --weights q8", "--force", 1},
      {"convert --model /nonexistent/model" + out + " --weights q8", "/nonexistent/model", 1},
      {"convert --model " + kSmallModel + out + " --weights q3", "--weights", 2},
      {"convert --model " + kSmallModel + out + " --weights q4 --group-size 20", "--group-size", 2},
      {"convert --model " + kSmallModel + out, "--weights", 2},
  };
  for (const Case& c : cases) {
    auto r = run_binary(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect_in_error), std::string::npos) << c.args << "\nstderr: " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir / "new"));
  EXPECT_FALSE(has_tmp_leftover(dir));
  EXPECT_TRUE(fs::is_empty(dir / "exists"));
  // --force replaces the existing directory.
  auto r = run_binary("convert --model " + kSmallModel + " --out " + (dir / "exists").string() + " --weights q8 --force --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_TRUE(fs::exists(dir / "exists" / "model.safetensors"));
  EXPECT_FALSE(has_tmp_leftover(dir));
  // A quantized checkpoint is not converted again.
  r = run_binary("convert --model " + (dir / "exists").string() + out + " --weights q4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("already quantized"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dc
