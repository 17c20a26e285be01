// tokenizer.ggml.* metadata ↔ Tokenizer (tokenizer_gguf.h).
#include "gguf/tokenizer_gguf.h"

#include "gguf/dream.h"

namespace dc {
namespace {

// The string array at `key`, or an error naming it.
Result<const GgufValue*> string_array(const GgufFile& f, const char* key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return not_found(f.path() + ": metadata key '" + key + "' is missing (the tokenizer needs it)");
  if (v->type != GgufValueType::kArray || v->elem != GgufValueType::kString)
    return invalid_argument(f.path() + ": metadata '" + key + "' must be an array of strings");
  return v;
}

// The tokenizer.ggml metadata as the parts of a Qwen2 byte-level BPE (views into the mapped file).
Result<Tokenizer::BpeParts> gguf_bpe_parts(const GgufFile& f) {
  DC_ASSIGN_OR_RETURN(std::string_view model, f.get_string("tokenizer.ggml.model"));
  if (model != "gpt2")
    return unimplemented(f.path() + ": tokenizer.ggml.model is '" + std::string(model) +
                         "'; only gpt2 (byte-level BPE, as Dream / DiffuCoder use) is supported");
  DC_ASSIGN_OR_RETURN(std::string_view pre, f.get_string("tokenizer.ggml.pre"));
  if (pre != "qwen2")
    return unimplemented(f.path() + ": tokenizer.ggml.pre is '" + std::string(pre) +
                         "'; only qwen2 (the Qwen2 pre-tokenizer of Dream / DiffuCoder) is supported");
  DC_ASSIGN_OR_RETURN(const GgufValue* tokens, string_array(f, "tokenizer.ggml.tokens"));
  DC_ASSIGN_OR_RETURN(const GgufValue* merges, string_array(f, "tokenizer.ggml.merges"));
  const GgufValue* types = f.find("tokenizer.ggml.token_type");
  if (types == nullptr || types->type != GgufValueType::kArray || !(types->elem == GgufValueType::kI32 ||
                                                                  types->elem == GgufValueType::kU32))
    return invalid_argument(f.path() + ": metadata 'tokenizer.ggml.token_type' must be an array of int32");
  if (types->n != tokens->n)
    return invalid_argument(f.path() + ": tokenizer.ggml.token_type has " + std::to_string(types->n) +
                            " entries but tokenizer.ggml.tokens has " + std::to_string(tokens->n));
  if (tokens->n > static_cast<uint64_t>(INT32_MAX))
    return out_of_range(f.path() + ": tokenizer.ggml.tokens holds more than 2^31 tokens");
  Tokenizer::BpeParts parts;
  for (uint64_t id = 0; id < tokens->n; ++id) {
    const std::string_view text = tokens->strings[id];
    switch (types->int_at(id)) {
      case kTokenNormal: case kTokenUnknown: case kTokenByte:
        parts.vocab.emplace_back(text, static_cast<int32_t>(id));
        break;
      case kTokenControl: case kTokenUserDefined: {
        AddedToken a;
        a.id = static_cast<int32_t>(id);
        a.content = std::string(text);
        a.special = types->int_at(id) == kTokenControl;
        parts.added.push_back(std::move(a));
        break;
      }
      case kTokenUnused: break;
      default:
        return invalid_argument(f.path() + ": tokenizer.ggml.token_type[" + std::to_string(id) + "] is " +
                                std::to_string(types->int_at(id)) + ", not a llama.cpp token type (1 to 6)");
    }
  }
  parts.merges.assign(merges->strings.begin(), merges->strings.end());
  return parts;
}

}  // namespace

bool gguf_has_tokenizer(const GgufFile& file) { return file.find("tokenizer.ggml.tokens") != nullptr; }

Result<Tokenizer> gguf_tokenizer(const GgufFile& f) {
  DC_ASSIGN_OR_RETURN(const Tokenizer::BpeParts parts, gguf_bpe_parts(f));
  return Tokenizer::from_qwen2_bpe(parts, f.path() + " (tokenizer.ggml metadata)");
}

Result<std::string> gguf_tokenizer_json(const GgufFile& f) {
  DC_ASSIGN_OR_RETURN(const Tokenizer::BpeParts parts, gguf_bpe_parts(f));
  DC_RETURN_IF_ERROR(Tokenizer::from_qwen2_bpe(parts, f.path() + " (tokenizer.ggml metadata)").status());
  return Tokenizer::qwen2_bpe_json(parts, f.path() + " (tokenizer.ggml metadata)");
}

std::optional<std::string> gguf_chat_template(const GgufFile& f) {
  const GgufValue* v = f.find("tokenizer.chat_template");
  if (v == nullptr || v->type != GgufValueType::kString) return std::nullopt;
  return std::string(v->s);
}

GgufVocab gguf_vocab(const Tokenizer& tok, int64_t n_vocab) {
  GgufVocab v;
  v.tokens.reserve(static_cast<size_t>(n_vocab));
  v.types.reserve(static_cast<size_t>(n_vocab));
  std::vector<int8_t> added(static_cast<size_t>(std::max<int64_t>(n_vocab, tok.vocab_size())), 0);
  for (const AddedToken& a : tok.added_tokens()) added[static_cast<size_t>(a.id)] = a.special ? 2 : 1;
  for (int64_t id = 0; id < n_vocab; ++id) {
    const std::optional<std::string_view> text =
        id < tok.vocab_size() ? tok.id_to_token(static_cast<int32_t>(id)) : std::nullopt;
    if (!text) {
      v.tokens.push_back("[PAD" + std::to_string(id) + "]");
      v.types.push_back(kTokenUnused);
      continue;
    }
    v.tokens.emplace_back(*text);
    v.types.push_back(added[static_cast<size_t>(id)] == 2   ? kTokenControl
                      : added[static_cast<size_t>(id)] == 1 ? kTokenUserDefined
                                                            : kTokenNormal);
  }
  v.merges.reserve(tok.merges().size());
  for (const auto& [left, right] : tok.merges())
    v.merges.push_back(std::string(*tok.id_to_token(left)) + " " + std::string(*tok.id_to_token(right)));
  return v;
}

Result<Tokenizer> load_tokenizer_file(const std::string& path) {
  if (!is_gguf_path(path)) return Tokenizer::from_file(path);
  DC_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
  if (!gguf_has_tokenizer(file))
    return not_found(path + ": the file has no tokenizer (tokenizer.ggml.tokens); re-convert it with its tokenizer");
  return gguf_tokenizer(file);
}

}  // namespace dc
