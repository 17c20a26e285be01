// The tokenizer of a GGUF file (tokenizer.ggml.* metadata) as our Tokenizer, and the reverse: a
// Tokenizer's vocabulary as that metadata (what llama.cpp's converter writes for a gpt2 / qwen2 BPE).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace dc {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum GgufTokenType : int32_t {
  kTokenNormal = 1, kTokenUnknown = 2, kTokenControl = 3, kTokenUserDefined = 4, kTokenUnused = 5, kTokenByte = 6,
};

// True when the file carries a tokenizer (tokenizer.ggml.tokens).
bool gguf_has_tokenizer(const GgufFile& file);

// Builds the tokenizer: tokenizer.ggml.model must be "gpt2" and .pre "qwen2" (else kUnimplemented
// naming the value); tokens and token_type of equal length, merges a string array. Normal (and
// unknown / byte) tokens form the BPE vocabulary, control tokens are special added tokens,
// user-defined ones non-special added tokens, unused ones ([PAD<id>] fillers) are left out.
// Errors name the file and the key.
Result<Tokenizer> gguf_tokenizer(const GgufFile& file);
// The same tokenizer as a Hugging Face tokenizer.json text (what a training checkpoint started from a
// GGUF carries); checked as gguf_tokenizer checks it.
Result<std::string> gguf_tokenizer_json(const GgufFile& file);

// A tokenizer from `path`: a GGUF file's tokenizer.ggml metadata when it ends in ".gguf", else a
// tokenizer.json.
Result<Tokenizer> load_tokenizer_file(const std::string& path);

// tokenizer.chat_template, nullopt when absent.
std::optional<std::string> gguf_chat_template(const GgufFile& file);

// A tokenizer's vocabulary laid out as llama.cpp's converter does for `n_vocab` ids: every id below
// n_vocab in order, ids without a token as "[PAD<id>]" of type unused, added tokens control (special)
// or user-defined, the rest normal; merges as "left right" strings in rank order.
struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
};
GgufVocab gguf_vocab(const Tokenizer& tokenizer, int64_t n_vocab);

}  // namespace dc
