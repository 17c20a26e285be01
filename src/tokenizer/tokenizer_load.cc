// Loading a Hugging Face tokenizer.json into a Tokenizer: field-by-field validation with messages
// that name the file and the JSON field, and rejection of configurations this engine does not run.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace dc {

using Json = nlohmann::json;

// Builds a Tokenizer from parsed JSON; one instance per load, `source` names the file.
class TokenizerLoader {
 public:
  explicit TokenizerLoader(std::string source) : source_(std::move(source)) {}

  Result<Tokenizer> load(const TokenizerJson& doc) {
    const Json& root = doc.root;
    if (!root.is_object()) return error("(top level)", "must be a JSON object");
    Tokenizer tok;
    DC_RETURN_IF_ERROR(load_normalizer(root, &tok));
    DC_RETURN_IF_ERROR(load_pre_tokenizer(root, &tok));
    DC_RETURN_IF_ERROR(load_decoder(root));
    bool ignore_merges = false;
    DC_RETURN_IF_ERROR(load_model_options(root, doc, &ignore_merges));
    DC_RETURN_IF_ERROR(load_added_token_list(root, &tok.added_tokens_));
    DC_RETURN_IF_ERROR(build_vocab(doc, &tok));
    DC_RETURN_IF_ERROR(build_bpe(doc, ignore_merges, &tok));
    DC_RETURN_IF_ERROR(add_added_tokens(&tok));
    build_matchers(&tok);
    return tok;
  }

 private:
  Status error(const std::string& field, const std::string& what) const {
    return parse_error(source_ + ": field '" + field + "' " + what);
  }
  Status unsupported(const std::string& field, const std::string& what) const {
    return unimplemented(source_ + ": field '" + field + "' " + what);
  }

  // Reads an optional boolean; absent or null gives `fallback`.
  Status get_bool(const Json& obj, const char* key, const std::string& field, bool fallback, bool* out) const {
    *out = fallback;
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return Status::ok_status();
    if (!it->is_boolean()) return error(field + "." + key, "must be true or false");
    *out = it->get<bool>();
    return Status::ok_status();
  }
  // Reads the "type" string of a component object.
  Status get_type(const Json& obj, const std::string& field, std::string* out) const {
    if (!obj.is_object()) return error(field, "must be an object");
    const auto it = obj.find("type");
    if (it == obj.end() || !it->is_string()) return error(field + ".type", "must be a string");
    *out = it->get<std::string>();
    return Status::ok_status();
  }

  Status load_normalizer_node(const Json& node, const std::string& field, Tokenizer* tok) {
    if (node.is_null()) return Status::ok_status();
    std::string type;
    DC_RETURN_IF_ERROR(get_type(node, field, &type));
    if (type == "NFC") {
      tok->nfc_ = true;
      return Status::ok_status();
    }
    if (type == "Sequence") {
      const auto it = node.find("normalizers");
      if (it == node.end() || !it->is_array()) return error(field + ".normalizers", "must be an array");
      for (size_t i = 0; i < it->size(); ++i) {
        DC_RETURN_IF_ERROR(load_normalizer_node((*it)[i], field + ".normalizers[" + std::to_string(i) + "]", tok));
      }
      return Status::ok_status();
    }
    return unsupported(field + ".type", "is '" + type + "'; only NFC (or a Sequence of NFC) is supported");
  }

  Status load_normalizer(const Json& root, Tokenizer* tok) {
    const auto it = root.find("normalizer");
    if (it == root.end()) return Status::ok_status();
    return load_normalizer_node(*it, "normalizer", tok);
  }

  // Appends the steps of one pre-tokenizer node; *byte_level is set when it is a ByteLevel.
  Status load_pre_tokenizer_node(const Json& node, const std::string& field, Tokenizer* tok, bool* byte_level) {
    std::string type;
    DC_RETURN_IF_ERROR(get_type(node, field, &type));
    if (*byte_level) return unsupported(field, "follows ByteLevel; ByteLevel must be the last pre-tokenizer");
    if (type == "Sequence") {
      const auto it = node.find("pretokenizers");
      if (it == node.end() || !it->is_array()) return error(field + ".pretokenizers", "must be an array");
      for (size_t i = 0; i < it->size(); ++i) {
        DC_RETURN_IF_ERROR(
            load_pre_tokenizer_node((*it)[i], field + ".pretokenizers[" + std::to_string(i) + "]", tok, byte_level));
      }
      return Status::ok_status();
    }
    if (type == "Split") {
      const auto pattern = node.find("pattern");
      if (pattern == node.end() || !pattern->is_object()) return error(field + ".pattern", "must be an object");
      bool literal = false;
      std::string text;
      if (const auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
        text = r->get<std::string>();
      } else if (const auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
        text = s->get<std::string>();
        literal = true;
      } else {
        return error(field + ".pattern", "must hold a \"Regex\" or \"String\" string");
      }
      const auto behavior = node.find("behavior");
      if (behavior == node.end() || !behavior->is_string()) return error(field + ".behavior", "must be a string");
      if (behavior->get<std::string>() != "Isolated") {
        return unsupported(field + ".behavior", "is '" + behavior->get<std::string>() + "'; only Isolated is supported");
      }
      bool invert = false;
      DC_RETURN_IF_ERROR(get_bool(node, "invert", field, false, &invert));
      if (invert) return unsupported(field + ".invert", "is true; only false is supported");
      auto splitter = RegexSplitter::create(text, literal);
      if (!splitter.ok()) return splitter.status().with_context(source_ + ": field '" + field + ".pattern'");
      tok->splitters_.push_back(std::move(splitter).value());
      return Status::ok_status();
    }
    if (type == "ByteLevel") {
      bool add_prefix_space = true, use_regex = true;  // HF defaults
      DC_RETURN_IF_ERROR(get_bool(node, "add_prefix_space", field, true, &add_prefix_space));
      DC_RETURN_IF_ERROR(get_bool(node, "use_regex", field, true, &use_regex));
      if (add_prefix_space) return unsupported(field + ".add_prefix_space", "is true (or absent); only false is supported");
      if (use_regex) {
        auto splitter = RegexSplitter::create(kGpt2Pattern, false);
        if (!splitter.ok()) return splitter.status();
        tok->splitters_.push_back(std::move(splitter).value());
      }
      *byte_level = true;
      return Status::ok_status();
    }
    return unsupported(field + ".type", "is '" + type + "'; only Sequence, Split and ByteLevel are supported");
  }

  Status load_pre_tokenizer(const Json& root, Tokenizer* tok) {
    const auto it = root.find("pre_tokenizer");
    if (it == root.end() || it->is_null()) {
      return unsupported("pre_tokenizer", "is absent; a byte-level BPE needs a ByteLevel pre-tokenizer");
    }
    bool byte_level = false;
    DC_RETURN_IF_ERROR(load_pre_tokenizer_node(*it, "pre_tokenizer", tok, &byte_level));
    if (!byte_level) return unsupported("pre_tokenizer", "has no ByteLevel step; only byte-level BPE is supported");
    return Status::ok_status();
  }

  Status load_decoder(const Json& root) {
    const auto it = root.find("decoder");
    if (it == root.end() || it->is_null()) return unsupported("decoder", "is absent; only ByteLevel is supported");
    std::string type;
    DC_RETURN_IF_ERROR(get_type(*it, "decoder", &type));
    if (type != "ByteLevel") return unsupported("decoder.type", "is '" + type + "'; only ByteLevel is supported");
    return Status::ok_status();
  }

  Status load_model_options(const Json& root, const TokenizerJson& doc, bool* ignore_merges) const {
    const auto model = root.find("model");
    if (model == root.end() || !model->is_object()) return error("model", "must be an object");
    const auto type = model->find("type");
    if (type != model->end() && (!type->is_string() || type->get<std::string>() != "BPE")) {
      return unsupported("model.type", "is " + type->dump() + "; only BPE is supported");
    }
    if (const auto d = model->find("dropout"); d != model->end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0)) {
      return unsupported("model.dropout", "is set; BPE dropout is not supported");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const auto k = model->find(key);
      if (k != model->end() && !k->is_null() && !(k->is_string() && k->get<std::string>().empty())) {
        return unsupported(std::string("model.") + key, "is set; only an empty value is supported");
      }
    }
    if (!doc.has_vocab) return error("model.vocab", "must be an object of token: id");
    if (!doc.has_merges) return error("model.merges", "must be an array");
    return get_bool(*model, "ignore_merges", "model", false, ignore_merges);
  }

  Status load_added_token_list(const Json& root, std::vector<AddedToken>* added) const {
    const auto list = root.find("added_tokens");
    if (list == root.end() || list->is_null()) return Status::ok_status();
    if (!list->is_array()) return error("added_tokens", "must be an array");
    for (size_t i = 0; i < list->size(); ++i) {
      const Json& t = (*list)[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object()) return error(field, "must be an object");
      AddedToken a;
      const auto id = t.find("id");
      if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX) {
        return error(field + ".id", "must be a non-negative 32-bit integer");
      }
      const auto content = t.find("content");
      if (content == t.end() || !content->is_string() || content->get_ref<const std::string&>().empty()) {
        return error(field + ".content", "must be a non-empty string");
      }
      a.id = static_cast<int32_t>(id->get<int64_t>());
      a.content = content->get<std::string>();
      DC_RETURN_IF_ERROR(get_bool(t, "special", field, false, &a.special));
      DC_RETURN_IF_ERROR(get_bool(t, "single_word", field, false, &a.single_word));
      DC_RETURN_IF_ERROR(get_bool(t, "lstrip", field, false, &a.lstrip));
      DC_RETURN_IF_ERROR(get_bool(t, "rstrip", field, false, &a.rstrip));
      DC_RETURN_IF_ERROR(get_bool(t, "normalized", field, !a.special, &a.normalized));
      added->push_back(std::move(a));
    }
    return Status::ok_status();
  }

  // Builds the text pool (vocab texts, then added contents), the per-id spans of the vocab, and
  // token_ids_ for the vocab alone.
  Status build_vocab(const TokenizerJson& doc, Tokenizer* tok) {
    std::vector<char>& pool = tok->text_pool_;
    size_t pool_size = doc.vocab_pool.size();
    for (const AddedToken& a : tok->added_tokens_) pool_size += a.content.size();
    if (pool_size > UINT32_MAX) return error("model.vocab", "holds more than 4 GiB of text");
    pool.reserve(pool_size);
    pool.assign(doc.vocab_pool.begin(), doc.vocab_pool.end());
    for (const AddedToken& a : tok->added_tokens_) pool.insert(pool.end(), a.content.begin(), a.content.end());

    int32_t max_id = -1;
    for (const TokenizerJson::VocabEntry& e : doc.vocab) max_id = std::max(max_id, e.id);
    for (const AddedToken& a : tok->added_tokens_) max_id = std::max(max_id, a.id);
    tok->spans_.assign(static_cast<size_t>(max_id) + 1, {});
    tok->flags_.assign(static_cast<size_t>(max_id) + 1, 0);

    StringIdMap& ids = tok->token_ids_;
    ids.reserve(doc.vocab.size() + tok->added_tokens_.size());
    for (const TokenizerJson::VocabEntry& e : doc.vocab) {
      ids.set(std::string_view(pool.data() + e.offset, e.size), e.id);  // a repeated key keeps its last id, as serde
    }
    for (const TokenizerJson::VocabEntry& e : doc.vocab) {
      const std::string_view text(pool.data() + e.offset, e.size);
      if (ids.find(text) != e.id) continue;  // overwritten by a later duplicate key
      if (tok->flags_[e.id] & Tokenizer::kPresent) {
        return error("model.vocab", "uses id " + std::to_string(e.id) + " for both '" +
                                        std::string(tok->text_of(e.id)) + "' and '" + std::string(text) + "'");
      }
      tok->spans_[e.id].text = e.offset;
      tok->spans_[e.id].text_size = e.size;
      tok->flags_[e.id] |= Tokenizer::kPresent;
    }
    model_size_ = static_cast<int64_t>(ids.size());
    return Status::ok_status();
  }

  // Resolves the merges to ids. Must run before added tokens enter token_ids_ (merges see the
  // model vocab only).
  Status build_bpe(const TokenizerJson& doc, bool ignore_merges, Tokenizer* tok) const {
    const StringIdMap& ids = tok->token_ids_;
    std::array<int32_t, 256> byte_ids{};
    for (int b = 0; b < 256; ++b) {
      const std::string_view c = byte_level::char_of_byte(static_cast<uint8_t>(b));
      byte_ids[b] = ids.find(c);
      if (byte_ids[b] < 0) {
        return error("model.vocab", "lacks the byte-level token '" + std::string(c) + "' of byte " + std::to_string(b) +
                                        "; every byte needs one");
      }
    }
    std::vector<BpeModel::Merge> merges;
    merges.reserve(doc.merges.size());
    std::string joined;
    for (size_t r = 0; r < doc.merges.size(); ++r) {
      const TokenizerJson::MergeEntry& m = doc.merges[r];
      std::string_view left = doc.merge_left(m), right = doc.merge_right(m);
      if (m.legacy) {  // "left right"
        const size_t space = left.find(' ');
        if (space == std::string_view::npos || left.find(' ', space + 1) != std::string_view::npos) {
          return error("model.merges[" + std::to_string(r) + "]",
                       "is '" + std::string(left) + "'; a merge string must be two tokens separated by one space");
        }
        right = left.substr(space + 1);
        left = left.substr(0, space);
      }
      joined.assign(left);
      joined += right;
      const BpeModel::Merge merge{ids.find(left), ids.find(right), ids.find(joined)};
      if (merge.left < 0 || merge.right < 0 || merge.merged < 0) {
        const std::string_view missing = merge.left < 0 ? left : merge.right < 0 ? right : std::string_view(joined);
        return error("model.merges[" + std::to_string(r) + "]",
                     "needs '" + std::string(missing) + "', which is not in model.vocab");
      }
      merges.push_back(merge);
    }
    std::unordered_map<std::string, int32_t> word_ids;
    if (ignore_merges) {
      std::string bytes;
      for (int32_t id = 0; id < tok->vocab_size(); ++id) {
        if ((tok->flags_[id] & Tokenizer::kPresent) && byte_level::to_bytes(tok->text_of(id), &bytes)) {
          word_ids.emplace(bytes, id);
        }
      }
    }
    tok->merges_.reserve(merges.size());
    for (const BpeModel::Merge& m : merges) tok->merges_.emplace_back(m.left, m.right);
    tok->bpe_.emplace(byte_ids, merges, std::move(word_ids), ignore_merges);
    return Status::ok_status();
  }

  // Checks each added token's id against the one HF would assign, then enters it in the tables.
  Status add_added_tokens(Tokenizer* tok) {
    int64_t max_added = -1;
    uint32_t offset = static_cast<uint32_t>(tok->text_pool_.size());
    for (const AddedToken& a : tok->added_tokens_) offset -= static_cast<uint32_t>(a.content.size());
    StringIdMap seen;  // contents of the added tokens so far (views into text_pool_)
    for (size_t i = 0; i < tok->added_tokens_.size(); ++i) {
      const AddedToken& a = tok->added_tokens_[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      const std::string_view content(tok->text_pool_.data() + offset, a.content.size());
      if (seen.find(content) >= 0) return error(field + ".content", "'" + a.content + "' repeats an earlier added token");
      // HF tokenizers ignores the ids written here: a content found in model.vocab keeps its vocab
      // id, any other takes the next id after the vocab and the added tokens before it. Accept
      // only files where both agree, so ids never silently differ from the reference.
      const int32_t vocab_id = tok->token_ids_.find(content);
      const int64_t hf_id = vocab_id >= 0 ? vocab_id : std::max(max_added, model_size_ - 1) + 1;
      if (a.id != hf_id) {
        return error(field + ".id", "is " + std::to_string(a.id) + " for '" + a.content +
                                        "', but Hugging Face tokenizers assigns it id " + std::to_string(hf_id) +
                                        " (its vocab id, else the next free id in file order); fix the file");
      }
      max_added = std::max<int64_t>(max_added, a.id);
      seen.set(content, a.id);
      Tokenizer::TokenSpan& span = tok->spans_[a.id];
      span.text = offset;
      span.text_size = static_cast<uint32_t>(content.size());
      tok->flags_[a.id] |= Tokenizer::kPresent | (a.special ? Tokenizer::kSpecial : 0);
      offset += static_cast<uint32_t>(content.size());
    }
    for (const AddedToken& a : tok->added_tokens_) tok->token_ids_.set(tok->text_of(a.id), a.id);

    // What decode emits: HF's ByteLevel decoder maps a token through the byte alphabet when every
    // character is in it, else keeps the text as is.
    std::vector<char>& pool = tok->bytes_pool_;
    pool.reserve(tok->text_pool_.size());
    std::string bytes;
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      if (!(tok->flags_[id] & Tokenizer::kPresent)) continue;
      const std::string_view text = tok->text_of(id);
      if (!byte_level::to_bytes(text, &bytes)) bytes.assign(text);
      tok->spans_[id].bytes = static_cast<uint32_t>(pool.size());
      tok->spans_[id].bytes_size = static_cast<uint32_t>(bytes.size());
      pool.insert(pool.end(), bytes.begin(), bytes.end());
    }
    return Status::ok_status();
  }

  void build_matchers(Tokenizer* tok) const {
    std::vector<AddedToken> raw, normalized;
    for (AddedToken a : tok->added_tokens_) {
      if (a.normalized && tok->nfc_) utf8::nfc(std::string(a.content), &a.content);
      (a.normalized ? normalized : raw).push_back(std::move(a));
    }
    tok->raw_matcher_ = AddedTokenMatcher(std::move(raw));
    tok->normalized_matcher_ = AddedTokenMatcher(std::move(normalized));
  }

  std::string source_;
  int64_t model_size_ = 0;  // entries in model.vocab (HF's BPE get_vocab_size)
};

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text, const std::string& source) {
  DC_ASSIGN_OR_RETURN(TokenizerJson doc, parse_tokenizer_json(json_text, source));
  return TokenizerLoader(source).load(doc);
}

namespace {

// Qwen2's tokenizer.json pipeline (llama.cpp's pre-tokenizer "qwen2") with `added`, without the BPE
// model's vocab and merges.
Json qwen2_bpe_root(const std::vector<AddedToken>& added) {
  static const char* kQwen2Regex =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+";
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  Json root = {{"normalizer", {{"type", "NFC"}}},
               {"pre_tokenizer", {{"type", "Sequence"},
                                  {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}},
                                                      {"behavior", "Isolated"}, {"invert", false}},
                                                     byte_level}}}},
               {"decoder", byte_level},
               {"model", {{"type", "BPE"}, {"ignore_merges", false}}},
               {"added_tokens", Json::array()}};
  for (const AddedToken& a : added)
    root["added_tokens"].push_back({{"id", a.id}, {"content", a.content}, {"special", a.special},
                                    {"single_word", a.single_word}, {"lstrip", a.lstrip}, {"rstrip", a.rstrip},
                                    {"normalized", a.normalized}});
  return root;
}

}  // namespace

Result<std::string> Tokenizer::qwen2_bpe_json(const BpeParts& parts, const std::string& source) {
  Json root = qwen2_bpe_root(parts.added);
  Json vocab = Json::object();
  for (const auto& [text, id] : parts.vocab) vocab[std::string(text)] = id;
  Json merges = Json::array();
  for (std::string_view m : parts.merges) merges.push_back(std::string(m));
  root["model"]["vocab"] = std::move(vocab);
  root["model"]["merges"] = std::move(merges);
  try {
    return root.dump();
  } catch (const Json::exception& e) {  // a token or merge that is not valid UTF-8
    return invalid_argument(source + ": cannot be written as tokenizer.json (" + e.what() + ")");
  }
}

Result<Tokenizer> Tokenizer::from_qwen2_bpe(const BpeParts& parts, const std::string& source) {
  TokenizerJson doc;
  doc.root = qwen2_bpe_root(parts.added);
  doc.has_vocab = doc.has_merges = true;
  for (const auto& [text, id] : parts.vocab) {
    if (doc.vocab_pool.size() + text.size() > UINT32_MAX) return parse_error(source + ": the vocabulary holds more than 4 GiB");
    doc.vocab.push_back({static_cast<uint32_t>(doc.vocab_pool.size()), static_cast<uint32_t>(text.size()), id});
    doc.vocab_pool.append(text);
  }
  for (std::string_view m : parts.merges) {
    if (doc.merge_pool.size() + m.size() > UINT32_MAX) return parse_error(source + ": the merges hold more than 4 GiB");
    doc.merges.push_back({static_cast<uint32_t>(doc.merge_pool.size()), static_cast<uint32_t>(m.size()), 0, true});
    doc.merge_pool.append(m);
  }
  return TokenizerLoader(source).load(doc);
}

Result<Tokenizer> Tokenizer::from_file(const std::string& tokenizer_json_path) {
  // O_NONBLOCK: a FIFO must not block the open; only regular files up to the limit are read.
  const int fd = ::open(tokenizer_json_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return not_found(tokenizer_json_path + ": cannot open the tokenizer file (" + std::strerror(errno) + "); check the path");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(tokenizer_json_path + ": not a regular file (a directory or device?); pass tokenizer.json");
  }
  if (st.st_size > kMaxTokenizerJsonBytes) {
    ::close(fd);
    return out_of_range(tokenizer_json_path + ": " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                        std::to_string(kMaxTokenizerJsonBytes) + " for a tokenizer.json");
  }
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));  // one allocation for the whole file (Qwen2's: 7 MB)
  char buf[1 << 16];
  bool failed = false;
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed = true;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > kMaxTokenizerJsonBytes) break;  // the file grew while read
  }
  ::close(fd);
  if (failed) return io_error(tokenizer_json_path + ": reading the tokenizer file failed");
  if (static_cast<int64_t>(text.size()) > kMaxTokenizerJsonBytes)
    return out_of_range(tokenizer_json_path + ": larger than the limit of " + std::to_string(kMaxTokenizerJsonBytes) +
                        " bytes for a tokenizer.json");
  return from_json_text(text, tokenizer_json_path);
}

}  // namespace dc
