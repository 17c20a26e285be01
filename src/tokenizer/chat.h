// Prompt text for DiffuCoder-Instruct: the README / inference_demo single-turn format and the
// Qwen2.5 chat-template layout used by the GRPO trainer (dream-reference.md §1.3).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dc {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

inline constexpr std::string_view kDefaultSystemPrompt = "You are a helpful assistant.";

// "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{query}\n<|im_end|>\n
// <|im_start|>assistant\n" (one string), where {query} is `user_query` without leading and trailing
// white space (Python str.strip()). Note the newline before the user's <|im_end|>, as in the README.
std::string format_instruct_prompt(std::string_view user_query);

// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, contents verbatim, preceded by the
// default system message when the first message is not a system message, and followed by
// "<|im_start|>assistant\n" when `add_generation_prompt`. InvalidArgument naming the message
// index for a role other than system, user or assistant, or for no messages at all.
Result<std::string> format_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true);

}  // namespace dc
