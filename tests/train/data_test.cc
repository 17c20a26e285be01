// load_dataset on the real DiffuCoder tokenizer (the tiny-vocab fixture's tokenizer.json): prompt /
// completion canvases, chat messages, the Instruct template, plain-text packing, errors; DataOrder.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "fixtures.h"
#include "tokenizer/chat.h"
#include "train/data.h"
#include "temp_dir.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::from_file((fs::path(testing::fixtures_dir()) / "tiny-vocab" / "tokenizer.json").string());
    ASSERT_TRUE(t.ok()) << t.status().message();
    tok_ = std::make_unique<Tokenizer>(std::move(*t));
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::vector<int32_t> ids(const std::string& s) { return *tok_->encode(s); }

  std::unique_ptr<Tokenizer> tok_;
  const test::TempDir tmp_{"data_test"};
  const fs::path dir_{tmp_.path()};
};

TEST_F(DataTest, PromptCompletionCanvasPaddedAndScoredAfterThePrompt) {
  DataOptions o;
  o.seq_len = 24, o.pad_token_id = 151667;
  auto ds = load_dataset(write("a.jsonl", R"({"prompt": "def add(a, b):", "completion": "\n    return a + b"})"
                                          "\n\n"
                                          R"({"prompt": "x", "completion": "y = 1"})"
                                          "\n"),
                         *tok_, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  ASSERT_EQ(ds->sequences.size(), 2u);
  const auto p = ids("def add(a, b):"), c = ids("\n    return a + b");
  const TrainSequence& s = ds->sequences[0];
  ASSERT_EQ(s.tokens.size(), 24u);
  ASSERT_EQ(s.loss_mask.size(), 24u);
  for (size_t j = 0; j < 24; ++j) {
    const int32_t want = j < p.size() ? p[j] : j < p.size() + c.size() ? c[j - p.size()] : 151667;
    EXPECT_EQ(s.tokens[j], want) << "position " << j;
    EXPECT_EQ(s.loss_mask[j], j < p.size() ? 0 : 1) << "position " << j;
  }
}

TEST_F(DataTest, InstructTemplateAndChatMessages) {
  DataOptions o;
  o.seq_len = 64, o.pad_token_id = 151667, o.instruct_template = true;
  auto ds = load_dataset(write("b.jsonl", R"({"prompt": "Say hi.", "completion": "hi"})"), *tok_, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  const auto p = ids(format_instruct_prompt("Say hi.")), c = ids("hi<|im_end|>");
  const TrainSequence& s = ds->sequences.at(0);
  EXPECT_TRUE(std::equal(p.begin(), p.end(), s.tokens.begin()));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), s.tokens.begin() + p.size()));
  EXPECT_EQ(c.back(), 151645);  // <|im_end|>
  EXPECT_EQ(std::count(s.loss_mask.begin(), s.loss_mask.end(), 0), static_cast<long>(p.size()));

  o.instruct_template = false;
  ds = load_dataset(write("c.jsonl", R"({"messages": [{"role": "user", "content": "Say hi."},)"
                                     R"( {"role": "assistant", "content": "hi"}]})"),
                    *tok_, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  const auto chat = ids(*format_chat({{"user", "Say hi."}}, true));
  const TrainSequence& m = ds->sequences.at(0);
  EXPECT_TRUE(std::equal(chat.begin(), chat.end(), m.tokens.begin()));
  EXPECT_TRUE(std::equal(c.begin(), c.end(), m.tokens.begin() + chat.size()));
  EXPECT_EQ(std::count(m.loss_mask.begin(), m.loss_mask.end(), 0), static_cast<long>(chat.size()));
}

TEST_F(DataTest, LongPromptsSkippedLongCompletionsTruncated) {
  DataOptions o;
  o.seq_len = 6, o.pad_token_id = 0;
  auto ds = load_dataset(write("d.jsonl", R"({"prompt": "a b c d e f g h i j", "completion": "k"})"
                                          "\n"
                                          R"({"prompt": "a", "completion": "b c d e f g h i j k l"})"),
                         *tok_, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  EXPECT_EQ(ds->sequences.size(), 1u);
  EXPECT_EQ(ds->n_skipped, 1);
  EXPECT_EQ(ds->n_truncated, 1);
}

TEST_F(DataTest, PlainTextPackedIntoFullCanvases) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n";
  DataOptions o;
  o.seq_len = 16;
  auto ds = load_dataset(write("corpus.py", text), *tok_, o);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  const auto all = ids(text);
  ASSERT_EQ(ds->sequences.size(), all.size() / 16);
  for (size_t i = 0; i < ds->sequences.size(); ++i) {
    EXPECT_TRUE(std::equal(all.begin() + i * 16, all.begin() + (i + 1) * 16, ds->sequences[i].tokens.begin()));
    EXPECT_EQ(std::count(ds->sequences[i].loss_mask.begin(), ds->sequences[i].loss_mask.end(), 1), 16);
  }
}

TEST_F(DataTest, BadInputNamesFileAndLine) {
  DataOptions o;
  o.seq_len = 16;
  auto err = [&](const std::string& path) {
    auto ds = load_dataset(path, *tok_, o);
    EXPECT_FALSE(ds.ok()) << path;
    return ds.ok() ? std::string() : ds.status().message();
  };
  const std::string bad_json = write("e.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{oops\n");
  EXPECT_NE(err(bad_json).find(bad_json + ":2"), std::string::npos);
  EXPECT_NE(err(write("f.jsonl", R"({"prompt": "a"})")).find("\"completion\""), std::string::npos);
  EXPECT_NE(err(write("g.jsonl", R"({"messages": [{"role": "user", "content": "a"}]})")).find("assistant"),
            std::string::npos);
  EXPECT_NE(err(write("h.jsonl", "[1, 2]")).find("JSON object"), std::string::npos);
  EXPECT_NE(err((dir_ / "missing.jsonl").string()).find("missing.jsonl"), std::string::npos);
  EXPECT_NE(err(write("short.txt", "tiny")).find("no training example"), std::string::npos);
}

TEST(DataOrder, EachEpochIsASeededPermutation) {
  DataOrder a(10, 5), b(10, 5), c(10, 6);
  std::vector<int64_t> first, second, other;
  for (int64_t i = 0; i < 10; ++i) first.push_back(a.sample_at(i));
  for (int64_t i = 10; i < 20; ++i) second.push_back(a.sample_at(i));
  for (int64_t i = 0; i < 10; ++i) other.push_back(c.sample_at(i));
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), 10u);
  EXPECT_EQ(std::set<int64_t>(second.begin(), second.end()).size(), 10u);
  EXPECT_NE(first, second);
  EXPECT_NE(first, other);
  for (int64_t i = 19; i >= 0; --i) EXPECT_EQ(b.sample_at(i), i < 10 ? first[i] : second[i - 10]);  // random access
}

}  // namespace
}  // namespace dc::train
