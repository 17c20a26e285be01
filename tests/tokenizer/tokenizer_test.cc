// Tokenizer behaviour beyond the goldens: a tiny synthetic tokenizer (merges, added-token
// matching, legacy merges, ignore_merges), error reporting, decode errors, threads, throughput.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace dc {
namespace {

using test::load_json;
using test::tiny_tokenizer_json;

std::vector<int32_t> encode_or_die(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(Tokenizer, TinyTokenizerAppliesMergesByRank) {
  auto tok = load_json(tiny_tokenizer_json());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 263);
  // "hello" -> he, ll, hell, hello; " world" -> Ġw o r l d.
  EXPECT_EQ(encode_or_die(*tok, "hello world"), (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(encode_or_die(*tok, "hellhe"), (std::vector<int32_t>{258, 256}));
  EXPECT_EQ(encode_or_die(*tok, ""), std::vector<int32_t>{});
  EXPECT_EQ(tok->token_to_id("Ġw"), 260);
  EXPECT_EQ(tok->id_to_token(259), "hello");
  EXPECT_FALSE(tok->id_to_token(263).has_value());
  EXPECT_FALSE(tok->token_to_id("nope").has_value());
}

TEST(Tokenizer, LegacyMergeStringsEqualPairs) {
  auto j = tiny_tokenizer_json();
  auto legacy = j;
  for (auto& m : legacy["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  auto a = load_json(j), b = load_json(legacy);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  for (const char* text : {"hello world", "hellohello hell he ll", " w w"}) {
    EXPECT_EQ(encode_or_die(*a, text), encode_or_die(*b, text)) << text;
  }
  legacy["model"]["merges"][0] = "h e x";
  auto bad = load_json(legacy);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.merges[0]"), std::string::npos) << bad.status().message();
}

TEST(Tokenizer, IgnoreMergesEmitsWholeVocabWords) {
  auto j = tiny_tokenizer_json();
  j["model"]["vocab"]["xyz"] = 261;  // reachable only as a whole word
  j["added_tokens"][0]["id"] = 262;  // the next ids after the vocab, as HF assigns them
  j["added_tokens"][1]["id"] = 263;
  auto plain = load_json(j);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(encode_or_die(*plain, "xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  j["model"]["ignore_merges"] = true;
  auto ignoring = load_json(j);
  ASSERT_TRUE(ignoring.ok()) << ignoring.status().to_string();
  EXPECT_EQ(encode_or_die(*ignoring, "xyz"), (std::vector<int32_t>{261}));
  EXPECT_EQ(encode_or_die(*ignoring, "hello"), (std::vector<int32_t>{259}));
}

TEST(Tokenizer, AddedTokensSplitLeftmostLongestBeforeBpe) {
  auto j = tiny_tokenizer_json();
  auto& added = j["added_tokens"];
  added.push_back({{"id", 263}, {"content", "<|e"}, {"special", true}});
  added.push_back({{"id", 264}, {"content", "ab"}, {"special", true}});
  added.push_back({{"id", 265}, {"content", "bcd"}, {"special", true}});
  auto tok = load_json(j);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode_or_die(*tok, "hello<|end|>hello"), (std::vector<int32_t>{259, 261, 259}));
  EXPECT_EQ(encode_or_die(*tok, "<|end|><|e"), (std::vector<int32_t>{261, 263}));  // longest at a position
  EXPECT_EQ(encode_or_die(*tok, "abcd"), (std::vector<int32_t>{264, 'c', 'd'}));   // leftmost wins over longer
  EXPECT_EQ(encode_or_die(*tok, "x<tool>y"), (std::vector<int32_t>{'x', 262, 'y'}));
  EXPECT_EQ(encode_or_die(*tok, "<|end|"), (std::vector<int32_t>{263, 'n', 'd', '|'}));
  // Special tokens are not normalised and split the text before NFC: the accent stays alone.
  EXPECT_EQ(encode_or_die(*tok, "e<|end|>\u0301"), (std::vector<int32_t>{'e', 261, 0xCC, 0x81}));
}

TEST(Tokenizer, SplitsDiffuCoderSpecialTokens) {
  const Tokenizer& tok = test::diffucoder_tokenizer();
  EXPECT_EQ(encode_or_die(tok, "a<|im_end|>b<|mask|><|dlm_pad|>"),
            (std::vector<int32_t>{64, 151645, 65, 151666, 151667}));
  EXPECT_EQ(encode_or_die(tok, "<|beginoftext|><|endoftext|>"), (std::vector<int32_t>{151665, 151643}));
  const auto prompt = encode_or_die(tok, "<|im_start|>user\nhi<|im_end|>\n");
  ASSERT_EQ(prompt.size(), 6u);
  EXPECT_EQ(prompt.front(), 151644);
  EXPECT_EQ(prompt[4], 151645);
  auto text = tok.decode({151644, 872, 151645, 151666, 151667});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>user<|im_end|><|mask|><|dlm_pad|>");
  auto skipped = tok.decode({151644, 872, 151645, 151657, 151666}, /*skip_special_tokens=*/true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "user<tool_call>");  // <tool_call> is not special
}

TEST(Tokenizer, DecodeReplacesBrokenUtf8AndRejectsUnknownIds) {
  auto tok = load_json(tiny_tokenizer_json());
  ASSERT_TRUE(tok.ok());
  auto broken = tok->decode({0xE4, 0xBD, 'a', 0xFF, 0xE4, 0xBD, 0xA0});
  ASSERT_TRUE(broken.ok());
  EXPECT_EQ(*broken, "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD" "\xE4\xBD\xA0");
  for (const int32_t bad : {-1, 263, 1 << 30}) {
    auto r = tok->decode({259, bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
    EXPECT_NE(r.status().message().find("ids[1]"), std::string::npos) << r.status().message();
  }
  auto skipped = tok->decode({259, 261, 262}, /*skip_special_tokens=*/true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "hello<tool>");
}

TEST(Tokenizer, RejectsInvalidUtf8WithByteOffset) {
  const Tokenizer& tok = test::diffucoder_tokenizer();
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"ab\xFF" "cd", 2}, {"abc\xE4\xBD", 3}, {"\xC0\xAF", 0}, {"x\xED\xA0\x80", 1}, {"ok \xF4\x90\x80\x80", 3}};
  for (const auto& [text, offset] : cases) {
    auto r = tok.encode(text);
    ASSERT_FALSE(r.ok()) << offset;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("byte " + std::to_string(offset)), std::string::npos) << r.status().message();
  }
  EXPECT_TRUE(tok.encode(std::string("nul\0inside", 10)).ok());
}

// Expects `j` to fail with `code` and a message naming `field`.
void expect_load_error(const nlohmann::json& j, StatusCode code, const std::string& field) {
  auto r = load_json(j);
  ASSERT_FALSE(r.ok()) << "loaded although " << field << " is bad";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find("tiny.json"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
}

TEST(Tokenizer, ReportsFileErrors) {
  auto missing = Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/dc_bad_tokenizer.json";
  std::ofstream(path) << tiny_tokenizer_json().dump().substr(0, 500);
  auto truncated = Tokenizer::from_file(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kParseError);
  EXPECT_NE(truncated.status().message().find(path), std::string::npos) << truncated.status().message();
  std::remove(path.c_str());

  auto not_json = Tokenizer::from_json_text("{\"model\": [1, 2,", "tiny.json");
  ASSERT_FALSE(not_json.ok());
  EXPECT_EQ(not_json.status().code(), StatusCode::kParseError);
}

TEST(Tokenizer, ReportsUnsupportedOrBrokenFields) {
  const auto base = tiny_tokenizer_json();
  auto j = base;
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, StatusCode::kUnimplemented, "model.type");
  j = base;
  j["model"]["vocab"]["h"] = "seven";
  expect_load_error(j, StatusCode::kParseError, "model.vocab");
  j = base;
  j["model"].erase("merges");
  expect_load_error(j, StatusCode::kParseError, "model.merges");
  j = base;
  j["model"]["merges"][1] = {"l", "zz"};
  expect_load_error(j, StatusCode::kParseError, "model.merges[1]");
  j = base;
  j["model"]["merges"][2] = {"x", "y"};  // "xy" is not in the vocab
  expect_load_error(j, StatusCode::kParseError, "model.merges[2]");
  j = base;
  j["model"]["vocab"].erase("Ġ");
  expect_load_error(j, StatusCode::kParseError, "model.vocab");
  j = base;
  j["model"]["dropout"] = 0.1;
  expect_load_error(j, StatusCode::kUnimplemented, "model.dropout");
  j = base;
  j["normalizer"] = {{"type", "NFKC"}};
  expect_load_error(j, StatusCode::kUnimplemented, "normalizer.type");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(j, StatusCode::kUnimplemented, "pre_tokenizer.pretokenizers[0].behavior");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  expect_load_error(j, StatusCode::kUnimplemented, "add_prefix_space");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(j, StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers[0].pattern");
  j = base;
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(j, StatusCode::kUnimplemented, "decoder.type");
  j = base;
  j["added_tokens"][0]["id"] = 300;  // HF would give it 261
  expect_load_error(j, StatusCode::kParseError, "added_tokens[0].id");
  j = base;
  j["added_tokens"][1]["content"] = "<|end|>";
  expect_load_error(j, StatusCode::kParseError, "added_tokens[1].content");
  j = base;
  j["added_tokens"][0].erase("content");
  expect_load_error(j, StatusCode::kParseError, "added_tokens[0].content");
}

TEST(Tokenizer, AddedTokenInVocabKeepsVocabId) {
  auto j = tiny_tokenizer_json();
  j["model"]["vocab"]["xyz"] = 261;  // no merge reaches it
  j["added_tokens"][0]["id"] = 262;  // the next ids after the vocab, as HF assigns them
  j["added_tokens"][1]["id"] = 263;
  j["added_tokens"].push_back({{"id", 261}, {"content", "xyz"}, {"special", false}});
  auto tok = load_json(j);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode_or_die(*tok, "axyzb"), (std::vector<int32_t>{'a', 261, 'b'}));
  EXPECT_EQ(tok->vocab_size(), 264);
}

TEST(Tokenizer, EncodesLongWhitespaceRuns) {
  const Tokenizer& tok = test::diffucoder_tokenizer();
  const std::string text = std::string(1 << 20, ' ') + "x" + std::string(300000, '\n') + "\t";
  auto ids = tok.encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  auto back = tok.decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const Tokenizer& tok = test::diffucoder_tokenizer();
  const auto entries = test::load_golden("edge_cases.json")["entries"];
  std::vector<std::string> texts;
  for (const auto& e : entries) texts.push_back(e["text"].get<std::string>());
  std::vector<std::vector<int32_t>> expected;
  for (const auto& e : entries) expected.push_back(e["ids"].get<std::vector<int32_t>>());
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = (t + round) % texts.size(), n = 0; n < texts.size(); ++n, i = (i + 1) % texts.size()) {
          auto ids = tok.encode(texts[i]);
          if (!ids.ok() || *ids != expected[i]) ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

// Prints the encode speed on ~1 MB of Python source; no assertion (timings vary by machine).
TEST(Tokenizer, ReportsEncodeThroughput) {
  const auto entries = test::load_golden("python_corpus.json")["entries"];
  std::string text;
  for (const auto& e : entries) {
    if (text.size() >= (1u << 20)) break;
    text += e["text"].get<std::string>();
  }
  if (text.size() < (1u << 20)) GTEST_SKIP() << "the Python corpus golden has less than 1 MB";
  auto fresh = Tokenizer::from_file(test::golden_path("diffucoder-tokenizer.json"));  // empty word cache
  ASSERT_TRUE(fresh.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto cold = fresh->encode(text);
  const auto t1 = std::chrono::steady_clock::now();
  auto warm = fresh->encode(text);
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(cold.ok() && warm.ok());
  const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("[ encode ] %.2f MB of Python -> %zu ids: %.1f ms with an empty word cache, %.1f ms warm\n",
              text.size() / 1048576.0, cold->size(), ms(t0, t1), ms(t1, t2));
}

}  // namespace
}  // namespace dc
