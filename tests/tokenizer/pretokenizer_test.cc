// The Qwen2 split regex on crafted strings, the \s translation for PCRE2, and the UTF-8 and
// byte-level helpers under the tokenizer.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace dc {
namespace {

std::vector<std::string> split_qwen2(std::string_view text) {
  static const RegexSplitter splitter = [] {
    auto r = RegexSplitter::create(kQwen2Pattern, false);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return std::move(r).value();
  }();
  std::vector<std::string_view> pieces;
  EXPECT_TRUE(splitter.split(text, &pieces).ok());
  return {pieces.begin(), pieces.end()};
}

using Pieces = std::vector<std::string>;

TEST(Pretokenizer, SplitsWordsNumbersPunctuationAndSpace) {
  EXPECT_EQ(split_qwen2("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split_qwen2("x = 12345;"), (Pieces{"x", " =", " ", "1", "2", "3", "4", "5", ";"}));
  EXPECT_EQ(split_qwen2("def f(a, b):\n    return a+b\n"),
            (Pieces{"def", " f", "(a", ",", " b", "):\n", "   ", " return", " a", "+b", "\n"}));
  EXPECT_EQ(split_qwen2("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(split_qwen2("a \n\n b"), (Pieces{"a", " \n\n", " b"}));
  EXPECT_EQ(split_qwen2("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(split_qwen2("\r\n\r\nx"), (Pieces{"\r\n\r\n", "x"}));
  EXPECT_EQ(split_qwen2("..."), (Pieces{"..."}));
  EXPECT_EQ(split_qwen2(" ...\n\nx"), (Pieces{" ...\n\n", "x"}));
  EXPECT_EQ(split_qwen2(""), Pieces{});
}

TEST(Pretokenizer, SplitsContractionsCaseInsensitively) {
  EXPECT_EQ(split_qwen2("I'm you're it's"), (Pieces{"I", "'m", " you", "'re", " it", "'s"}));
  EXPECT_EQ(split_qwen2("I'M YOU'LL WE'VE"), (Pieces{"I", "'M", " YOU", "'LL", " WE", "'VE"}));
  EXPECT_EQ(split_qwen2("'x"), (Pieces{"'x"}));
  EXPECT_EQ(split_qwen2("it\u2019s"), (Pieces{"it", "\u2019s"}));  // typographic apostrophe: not a contraction
}

TEST(Pretokenizer, UsesUnicodeClasses) {
  EXPECT_EQ(split_qwen2("你好，世界"), (Pieces{"你好", "，世界"}));
  EXPECT_EQ(split_qwen2("caf\u00e9 na\u00efve"), (Pieces{"caf\u00e9", " na\u00efve"}));
  EXPECT_EQ(split_qwen2("\u0663\u0664"), (Pieces{"\u0663", "\u0664"}));  // Arabic-Indic digits are \p{N}
  EXPECT_EQ(split_qwen2("a\u0301"), (Pieces{"a", "\u0301"}));            // a combining mark is not \p{L}
  EXPECT_EQ(split_qwen2("x😀😀y"), (Pieces{"x", "😀😀", "y"}));
}

// The Unicode White_Space property decides \s, as in Oniguruma: U+180E is not white space.
TEST(Pretokenizer, WhiteSpaceIsTheUnicodeProperty) {
  EXPECT_EQ(split_qwen2(" \u180e" "a"), (Pieces{" \u180e", "a"}));
  EXPECT_EQ(split_qwen2(" \u00a0" "a"), (Pieces{" ", "\u00a0" "a"}));
  EXPECT_EQ(split_qwen2(" \u3000" "a"), (Pieces{" ", "\u3000" "a"}));
  EXPECT_EQ(split_qwen2("x\u0085\u0085y"), (Pieces{"x", "\u0085", "\u0085y"}));
}

TEST(Pretokenizer, TranslatesWhiteSpaceEscapes) {
  const std::string t = translate_pattern_for_pcre2(R"(\s+(?!\S)|[^\s\p{L}]|\\s|[\]\s])");
  EXPECT_EQ(t.find("\\s"), t.find("\\\\s") + 1) << t;  // only the escaped backslash keeps its 's'
  EXPECT_NE(t.find("[^\\t\\n"), std::string::npos) << t;
  EXPECT_NE(t.find("(?![^\\t\\n"), std::string::npos) << t;
  EXPECT_NE(t.find("[\\]\\t\\n"), std::string::npos) << t;
}

TEST(Pretokenizer, LiteralPatternsAndGaps) {
  auto comma = RegexSplitter::create(",", /*literal=*/true);
  ASSERT_TRUE(comma.ok());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(comma->split("a,b,,c", &pieces).ok());
  EXPECT_EQ(Pieces(pieces.begin(), pieces.end()), (Pieces{"a", ",", "b", ",", ",", "c"}));
  auto maybe_empty = RegexSplitter::create("x*", false);  // empty matches split nothing
  ASSERT_TRUE(maybe_empty.ok());
  pieces.clear();
  ASSERT_TRUE(maybe_empty->split("abxxc", &pieces).ok());
  EXPECT_EQ(Pieces(pieces.begin(), pieces.end()), (Pieces{"ab", "xx", "c"}));
  EXPECT_FALSE(RegexSplitter::create("(unclosed", false).ok());
}

TEST(Utf8, FindsTheFirstIllFormedByte) {
  EXPECT_EQ(utf8::find_invalid("plain ascii text, long enough for the fast path"), std::nullopt);
  EXPECT_EQ(utf8::find_invalid("\xE4\xBD\xA0\xF0\x9F\x98\x80"), std::nullopt);
  EXPECT_EQ(utf8::find_invalid("0123456789\x80"), 10u);
  EXPECT_EQ(utf8::find_invalid("\xC1\xBF"), 0u);          // overlong
  EXPECT_EQ(utf8::find_invalid("ab\xED\xA0\x80"), 2u);    // surrogate
  EXPECT_EQ(utf8::find_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::find_invalid("ok\xE4\xBD"), 2u);        // truncated
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8::lossy("\xE4\xBD"), r);                           // one truncated sequence
  EXPECT_EQ(utf8::lossy("\xF0\x80\x80"), r + r + r);               // F0 80 is never valid
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), r + r + r);               // surrogate bytes one by one
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98" "a"), r + "a");
  EXPECT_EQ(utf8::lossy("a\xFF\xFE" "b"), "a" + r + r + "b");
  EXPECT_EQ(utf8::lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
}

TEST(Utf8, NfcComposes) {
  std::string out;
  utf8::nfc("e\u0301 A\u030A \u212b ascii", &out);
  EXPECT_EQ(out, "\u00e9 \u00c5 \u00c5 ascii");
  utf8::nfc(std::string("a\0b", 3), &out);
  EXPECT_EQ(out, std::string("a\0b", 3));
  utf8::nfc("q\u0307\u0323", &out);
  EXPECT_EQ(out, "q\u0323\u0307");  // canonical reordering
}

TEST(ByteLevel, MapsAllBytesBothWays) {
  EXPECT_EQ(byte_level::char_of_byte(' '), "Ġ");
  EXPECT_EQ(byte_level::char_of_byte('\n'), "Ċ");
  EXPECT_EQ(byte_level::char_of_byte('a'), "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  ASSERT_TRUE(byte_level::to_bytes(byte_level::from_bytes(all), &back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(byte_level::to_bytes("<|im_end|> ", &back));  // a plain space is not in the alphabet
}

}  // namespace
}  // namespace dc
