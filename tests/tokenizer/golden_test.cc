// The tokenizer against Hugging Face tokenizers: ids and decoded text for the goldens written by
// make_goldens.js (Python standard library sample, Unicode edge cases, added-token flags).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace dc {
namespace {

using test::describe_mismatch;
using test::diffucoder_tokenizer;
using test::load_golden;

// Encodes every entry of a golden corpus and compares ids; returns the number of entries.
size_t check_corpus_ids(const Tokenizer& tok, const nlohmann::json& entries) {
  size_t checked = 0, failures = 0;
  for (const auto& e : entries) {
    const std::string name = e["name"].get<std::string>();
    const auto expected = e["ids"].get<std::vector<int32_t>>();
    auto ids = tok.encode(e["text"].get<std::string>());
    ++checked;
    if (!ids.ok()) {
      ADD_FAILURE() << name << ": " << ids.status().to_string();
    } else if (const std::string diff = describe_mismatch(tok, expected, *ids); !diff.empty()) {
      ADD_FAILURE() << name << ": " << diff;
    } else {
      continue;
    }
    if (++failures >= 10) {
      ADD_FAILURE() << "stopping after 10 failing entries";
      break;
    }
  }
  return checked;
}

TEST(TokenizerGolden, PythonStdlibIdsMatchHuggingFace) {
  const auto golden = load_golden("python_corpus.json");
  if (golden["entries"].empty()) GTEST_SKIP() << "no Python standard library was found when the goldens were made";
  const size_t n = check_corpus_ids(diffucoder_tokenizer(), golden["entries"]);
  EXPECT_GT(n, 50u);
}

TEST(TokenizerGolden, EdgeCaseIdsMatchHuggingFace) {
  const size_t n = check_corpus_ids(diffucoder_tokenizer(), load_golden("edge_cases.json")["entries"]);
  EXPECT_GT(n, 50u);
}

TEST(TokenizerGolden, AddedTokenFlagsMatchHuggingFace) {
  auto tok = Tokenizer::from_file(test::golden_path("added-flags-tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto golden = load_golden("added_flags.json");
  EXPECT_GT(check_corpus_ids(*tok, golden["entries"]), 10u);
  for (const auto& e : golden["entries"]) {
    const auto ids = e["ids"].get<std::vector<int32_t>>();
    auto text = tok->decode(ids);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    EXPECT_EQ(*text, e["decoded"].get<std::string>()) << e["name"];
    auto skipped = tok->decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok());
    EXPECT_EQ(*skipped, e["decoded_skip"].get<std::string>()) << e["name"];
  }
}

// decode(encode(x)) gives x in NFC, and equals what HF decodes.
TEST(TokenizerGolden, DecodeOfEncodeIsNfcText) {
  const Tokenizer& tok = diffucoder_tokenizer();
  for (const char* file : {"edge_cases.json", "python_corpus.json"}) {
    const auto golden = load_golden(file);
    for (const auto& e : golden["entries"]) {
      const std::string text = e["text"].get<std::string>();
      const std::string nfc = e.contains("nfc") ? e["nfc"].get<std::string>() : text;
      auto ids = tok.encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status().to_string();
      auto decoded = tok.decode(*ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
      EXPECT_EQ(*decoded, nfc) << file << " " << e["name"];
      if (e.contains("decoded")) {
        EXPECT_EQ(*decoded, e["decoded"].get<std::string>()) << e["name"];
      }
    }
  }
}

TEST(TokenizerGolden, DecodeMatchesHuggingFace) {
  const Tokenizer& tok = diffucoder_tokenizer();
  const auto cases = load_golden("decode.json")["cases"];
  ASSERT_GT(cases.size(), 20u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto ids = cases[i]["ids"].get<std::vector<int32_t>>();
    const bool skip = cases[i]["skip_special"].get<bool>();
    auto text = tok.decode(ids, skip);
    ASSERT_TRUE(text.ok()) << text.status().to_string();
    EXPECT_EQ(*text, cases[i]["text"].get<std::string>()) << "case " << i << " skip_special=" << skip << " ids "
                                                          << test::show_ids(tok, ids, 0, ids.size());
  }
}

TEST(TokenizerGolden, VocabularyLookupsMatchHuggingFace) {
  const Tokenizer& tok = diffucoder_tokenizer();
  const auto meta = load_golden("meta.json");
  EXPECT_EQ(tok.vocab_size(), meta["vocab_size"].get<int32_t>());
  EXPECT_EQ(tok.vocab_size(), 151668);
  for (const auto& [token, id] : meta["token_to_id"].items()) {
    if (id.is_null()) {
      EXPECT_FALSE(tok.token_to_id(token).has_value()) << token;
    } else {
      EXPECT_EQ(tok.token_to_id(token), id.get<int32_t>()) << token;
    }
  }
  for (const auto& [id, token] : meta["id_to_token"].items()) {
    EXPECT_EQ(tok.id_to_token(std::stoi(id)), token.get<std::string>()) << id;
  }
  EXPECT_TRUE(tok.is_special(151666));
  EXPECT_TRUE(tok.is_special(151643));
  EXPECT_FALSE(tok.is_special(151657));  // <tool_call> is an added token but not special
  EXPECT_FALSE(tok.is_special(9707));
}

}  // namespace
}  // namespace dc
