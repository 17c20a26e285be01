// Chat prompt formatting; plain string building, no template engine.
#include "tokenizer/chat.h"

#include "tokenizer/utf8.h"

namespace dc {
namespace {

// Python's str.isspace(): Unicode White_Space plus the information separators U+001C..U+001F.
bool is_python_space(char32_t cp) { return utf8::is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

// `text` without leading and trailing Python white space. Ill-formed UTF-8 is never stripped.
std::string_view strip(std::string_view text) {
  if (utf8::find_invalid(text)) {
    size_t b = 0, e = text.size();
    while (b < e && is_python_space(static_cast<unsigned char>(text[b]))) ++b;
    while (e > b && is_python_space(static_cast<unsigned char>(text[e - 1]))) --e;
    return text.substr(b, e - b);
  }
  size_t begin = 0;
  while (begin < text.size()) {
    size_t pos = begin;
    if (!is_python_space(utf8::next_code_point(text, &pos))) break;
    begin = pos;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!is_python_space(utf8::next_code_point(text, &pos))) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

void append_turn(std::string_view role, std::string_view content, std::string* out) {
  *out += "<|im_start|>";
  *out += role;
  *out += '\n';
  *out += content;
  *out += "<|im_end|>\n";
}

}  // namespace

std::string format_instruct_prompt(std::string_view user_query) {
  std::string out;
  append_turn("system", kDefaultSystemPrompt, &out);
  out += "<|im_start|>user\n";
  out += strip(user_query);
  out += "\n<|im_end|>\n<|im_start|>assistant\n";
  return out;
}

Result<std::string> format_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  if (messages.empty()) return invalid_argument("format_chat: no messages");
  std::string out;
  if (messages.front().role != "system") append_turn("system", kDefaultSystemPrompt, &out);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return invalid_argument("format_chat: messages[" + std::to_string(i) + "].role is '" + m.role +
                              "'; use system, user or assistant");
    }
    append_turn(m.role, m.content, &out);
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace dc
