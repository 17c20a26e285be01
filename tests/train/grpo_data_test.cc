// load_grpo_dataset on the real DiffuCoder tokenizer (the tiny-vocab fixture): the spec §4.1 prompt of
// AceCode lines, prompt / messages lines, left truncation to max_prompt_length, and the errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fixtures.h"
#include "tokenizer/chat.h"
#include "train/grpo_data.h"
#include "temp_dir.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHeader = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n";
constexpr const char* kFooter = "<|im_end|>\n<|im_start|>assistant\n";

class GrpoDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::from_file((fs::path(testing::fixtures_dir()) / "tiny-vocab" / "tokenizer.json").string());
    ASSERT_TRUE(t.ok()) << t.status().message();
    tok_ = std::make_unique<Tokenizer>(std::move(*t));
  }
  std::string write(const std::string& text) {
    const std::string p = (dir_ / "data.jsonl").string();
    std::ofstream(p) << text;
    return p;
  }
  Result<GrpoDataset> load(const std::string& text, const GrpoDataOptions& o = {}) {
    return load_grpo_dataset(write(text), *tok_, o);
  }
  // The error message of loading `text` (empty when it loads).
  std::string error_of(const std::string& text, const GrpoDataOptions& o = {}) {
    auto ds = load(text, o);
    return ds.ok() ? "" : ds.status().message();
  }

  std::unique_ptr<Tokenizer> tok_;
  const test::TempDir tmp_{"grpo_data_test"};
  const fs::path dir_{tmp_.path()};
};

TEST_F(GrpoDataTest, AceCodeQuestionGetsTheFirstTestCaseUnlessItHoldsACodeBlock) {
  auto ds = load(R"({"id": "a1", "question": "Write f.", "test_cases": ["assert f(1) == 2", "assert f(2) == 3"]})" "\n"
                 R"({"question": "Complete:\n```\ndef g():\n```\n", "test_cases": ["assert g() is None"]})" "\n");
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  ASSERT_EQ(ds->examples.size(), 2u);
  const GrpoExample& a = ds->examples[0];
  EXPECT_EQ(a.prompt_text, std::string(kHeader) + "Write f.\nTest cases: assert f(1) == 2" + kFooter);
  EXPECT_EQ(a.prompt_ids, *tok_->encode(a.prompt_text));
  EXPECT_EQ(a.tests, (std::vector<std::string>{"assert f(1) == 2", "assert f(2) == 3"}));
  EXPECT_EQ(a.fields.at("id"), "a1");  // the other fields are kept for a user reward
  EXPECT_EQ(a.line, 1);
  EXPECT_EQ(a.n_truncated, 0);
  EXPECT_EQ(ds->examples[1].prompt_text, std::string(kHeader) + "Complete:\n```\ndef g():\n```\n" + kFooter);
  EXPECT_EQ(acecode_user_message("q", {}), "q");
}

TEST_F(GrpoDataTest, PromptAndMessagesLines) {
  auto ds = load(R"({"prompt": "Add one.", "tests": ["assert f(0) == 1"]})" "\n\n"
                 R"({"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}], "tests": ["pass"]})" "\n");
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  ASSERT_EQ(ds->examples.size(), 2u);
  EXPECT_EQ(ds->examples[0].prompt_text, std::string(kHeader) + "Add one." + kFooter);  // no "Test cases:" suffix
  EXPECT_EQ(ds->examples[1].line, 3);
  EXPECT_EQ(ds->examples[1].prompt_text,
            std::string("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi") + kFooter);
  GrpoDataOptions raw;
  raw.chat = false;
  auto plain = load(R"({"prompt": "def f(x): return x", "tests": ["assert f(1) == 1"]})", raw);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->examples[0].prompt_text, "def f(x): return x");
  EXPECT_EQ(plain->examples[0].prompt_ids, *tok_->encode("def f(x): return x"));
}

TEST_F(GrpoDataTest, PromptsAreLeftTruncatedToMaxPromptLength) {
  GrpoDataOptions o;
  o.max_prompt_length = 5;
  auto ds = load(R"({"prompt": "one two three four five six seven eight", "tests": ["pass"]})" "\n"
                 R"({"prompt": "a", "tests": ["pass"]})" "\n",
                 o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  const std::vector<int32_t> full = *tok_->encode(ds->examples[0].prompt_text);
  ASSERT_GT(full.size(), 5u);
  EXPECT_EQ(ds->examples[0].prompt_ids, std::vector<int32_t>(full.end() - 5, full.end()));  // the last 5 tokens
  EXPECT_EQ(ds->examples[0].n_truncated, static_cast<int64_t>(full.size()) - 5);
  EXPECT_EQ(ds->n_truncated, 2);  // the chat layout alone is longer than 5 tokens
}

TEST_F(GrpoDataTest, TestsAreOptionalOnlyWhenAskedFor) {
  const std::string line = R"({"prompt": "p"})";
  EXPECT_NE(error_of(line).find("data.jsonl:1: needs a non-empty \"tests\""), std::string::npos) << error_of(line);
  GrpoDataOptions o;
  o.require_tests = false;
  auto ds = load(line, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  EXPECT_TRUE(ds->examples[0].tests.empty());
}

TEST_F(GrpoDataTest, ErrorsNameTheFileLineAndField) {
  auto has = [&](const std::string& text, const std::string& want) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find(want), std::string::npos) << "error: " << e << "\nwanted: " << want;
  };
  has("{\"prompt\": \"p\", \"tests\": [\"pass\"]}\n{oops", "data.jsonl:2: not valid JSON");
  has("[1, 2]", "data.jsonl:1: each line must be a JSON object");
  has(R"({"tests": ["pass"]})", "needs exactly one of \"prompt\", \"messages\"");
  has(R"({"prompt": "p", "question": "q", "tests": ["pass"]})", "found 2");
  has(R"({"prompt": 3, "tests": ["pass"]})", "data.jsonl:1: needs a string \"prompt\"");
  has(R"({"prompt": "p", "tests": "assert 1"})", "\"tests\" must be a list of strings");
  has(R"({"prompt": "p", "tests": ["pass", 7]})", "data.jsonl:1: \"tests\"[1] is not a string");
  has(R"({"question": "q", "test_cases": ["pass"], "tests": ["pass"]})", "both \"tests\" and \"test_cases\"");
  has(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tests": ["pass"]})",
      "the last message must be the user's");
  has(R"({"messages": [{"role": "robot", "content": "q"}, {"role": "user", "content": "a"}], "tests": ["pass"]})",
      "data.jsonl:1: ");
  has(R"({"messages": [], "tests": ["pass"]})", "\"messages\" must be a non-empty array");
  has("\n  \n", "holds no example");
  GrpoDataOptions o;
  o.max_prompt_length = 0;
  EXPECT_NE(error_of(R"({"prompt": "p", "tests": ["pass"]})", o).find("max_prompt_length"), std::string::npos);
  o.max_prompt_length = 200;
  o.chat = false;
  EXPECT_NE(error_of(R"({"prompt": "", "tests": ["pass"]})", o).find("encodes to no tokens"), std::string::npos);
  EXPECT_FALSE(load_grpo_dataset((dir_ / "missing.jsonl").string(), *tok_, {}).ok());
}

TEST_F(GrpoDataTest, TestCountIsLimited) {
  std::string tests = "[";
  for (int64_t i = 0; i <= kMaxTestsPerExample; ++i) tests += std::string(i ? "," : "") + "\"pass\"";
  tests += "]";
  EXPECT_NE(error_of(R"({"prompt": "p", "tests": )" + tests + "}").find("more than the limit"), std::string::npos);
}

}  // namespace
}  // namespace dc::train
