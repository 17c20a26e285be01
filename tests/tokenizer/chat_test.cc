// Exact prompt strings of the DiffuCoder instruct format and the Qwen2.5 chat layout.
#include <gtest/gtest.h>

#include "tokenizer/chat.h"

namespace dc {
namespace {

TEST(Chat, InstructPromptMatchesTheReadmeFormat) {
  EXPECT_EQ(format_instruct_prompt("  Write a quick sort.\n\n"),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWrite a quick sort.\n<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(format_instruct_prompt("\u3000\t x \u00a0\x1f"),  // Python str.strip() white space
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nx\n<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(format_instruct_prompt("a\n  b"),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\na\n  b\n<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(format_instruct_prompt(" \n "),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\n<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(Chat, InsertsTheDefaultSystemMessage) {
  auto text = format_chat({{"user", " hi "}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n");
}

TEST(Chat, KeepsAGivenSystemMessageAndTurns) {
  auto text = format_chat({{"system", "Be terse."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "3+3?"}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n");
  auto no_prompt = format_chat({{"user", "q"}}, /*add_generation_prompt=*/false);
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(*no_prompt, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n");
}

TEST(Chat, RejectsUnknownRolesAndEmptyConversations) {
  auto bad = format_chat({{"user", "a"}, {"tool", "b"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("messages[1]"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(format_chat({}).ok());
}

}  // namespace
}  // namespace dc
