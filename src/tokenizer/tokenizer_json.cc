// SAX handler for tokenizer.json. Streaming the two big tables avoids building ~450k small JSON
// nodes, which made loading several times slower.
#include "tokenizer/tokenizer_json.h"

namespace dc {
namespace {

using Json = nlohmann::json;

class Handler {
 public:
  explicit Handler(TokenizerJson* out) : out_(out) {}

  bool null() { return value(Json(nullptr)); }
  bool boolean(bool v) { return value(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return in(Kind::kVocab) ? vocab_id(v) : value(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) {
    return in(Kind::kVocab) ? vocab_id(v > INT64_MAX ? -1 : static_cast<int64_t>(v)) : value(Json(v));
  }
  bool number_float(Json::number_float_t v, const std::string&) {
    return in(Kind::kVocab) ? vocab_id(-1) : value(Json(v));
  }
  bool binary(Json::binary_t& v) { return value(Json(std::move(v))); }

  bool string(std::string& s) {
    if (in(Kind::kVocab)) return vocab_id(-1);
    if (in(Kind::kMerges)) {
      out_->merges.push_back({pool_size(out_->merge_pool), static_cast<uint32_t>(s.size()), 0, true});
      out_->merge_pool += s;
      return true;
    }
    if (in(Kind::kMergePair)) {
      Frame& f = stack_.back();
      if (f.count == 0) out_->merges.back().left_size = static_cast<uint32_t>(s.size());
      else if (f.count == 1) out_->merges.back().right_size = static_cast<uint32_t>(s.size());
      if (f.count < 2) out_->merge_pool += s;
      ++f.count;
      return true;
    }
    return value(Json(std::move(s)));
  }

  bool key(std::string& k) {
    if (in(Kind::kVocab)) {
      vocab_key_.assign(k);  // a copy: the lexer keeps its buffer's capacity for the next key
    } else {
      stack_.back().key = std::move(k);
    }
    return true;
  }

  bool start_object(std::size_t) {
    if (!depth_ok()) return false;
    if (streaming_key("vocab")) {
      out_->has_vocab = true;
      stack_.push_back(Frame{Kind::kVocab, nullptr, {}});
      return true;
    }
    return open(Json::object());
  }
  bool start_array(std::size_t) {
    if (!depth_ok()) return false;
    if (streaming_key("merges")) {
      out_->has_merges = true;
      stack_.push_back(Frame{Kind::kMerges, nullptr, {}});
      return true;
    }
    if (in(Kind::kMerges)) {
      out_->merges.push_back({pool_size(out_->merge_pool), 0, 0, false});
      stack_.push_back(Frame{Kind::kMergePair, nullptr, {}});
      return true;
    }
    return open(Json::array());
  }
  bool end_object() { return close(); }
  bool end_array() {
    if (in(Kind::kMergePair) && stack_.back().count != 2) return bad_entry();
    return close();
  }

  bool parse_error(std::size_t position, const std::string&, const Json::exception& e) {
    error_ = "not valid JSON at byte " + std::to_string(position) + " (" + e.what() + ")";
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  enum class Kind { kDom, kVocab, kMerges, kMergePair };
  struct Frame {
    Kind kind;
    Json* node;       // the object or array being filled (kDom only)
    std::string key;  // the last key read in this object
    int count = 0;    // strings read in a merge pair
  };

  static uint32_t pool_size(const std::string& pool) { return static_cast<uint32_t>(pool.size()); }

  bool depth_ok() {
    if (stack_.size() < static_cast<size_t>(kMaxTokenizerJsonDepth)) return true;
    error_ = "arrays and objects nest deeper than " + std::to_string(kMaxTokenizerJsonDepth) +
             " levels (a tokenizer.json needs a handful); the file is not a tokenizer";
    return false;
  }

  bool in(Kind kind) const { return !stack_.empty() && stack_.back().kind == kind; }

  // True when the value about to start is model.<name> (the parent is "model" under the root).
  bool streaming_key(const char* name) const {
    return stack_.size() == 2 && stack_[0].key == "model" && stack_[1].kind == Kind::kDom &&
           stack_[1].node->is_object() && stack_[1].key == name;
  }

  Json* place(Json v) {
    if (stack_.empty()) {
      out_->root = std::move(v);
      return &out_->root;
    }
    Frame& f = stack_.back();
    if (f.node->is_object()) {
      Json& slot = (*f.node)[f.key];
      slot = std::move(v);
      return &slot;
    }
    f.node->push_back(std::move(v));
    return &f.node->back();
  }
  bool value(Json v) {
    if (!stack_.empty() && stack_.back().kind != Kind::kDom) return bad_entry();
    place(std::move(v));
    return true;
  }
  bool open(Json v) {
    if (!stack_.empty() && stack_.back().kind != Kind::kDom) return bad_entry();
    Json* node = place(std::move(v));
    stack_.push_back(Frame{Kind::kDom, node, {}});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  bool vocab_id(int64_t id) {
    if (id < 0 || id > INT32_MAX) {
      error_ = "field 'model.vocab[\"" + vocab_key_ + "\"]' must be a non-negative 32-bit integer id";
      return false;
    }
    out_->vocab.push_back({pool_size(out_->vocab_pool), static_cast<uint32_t>(vocab_key_.size()), static_cast<int32_t>(id)});
    out_->vocab_pool += vocab_key_;
    return true;
  }
  bool bad_entry() {
    if (in(Kind::kVocab)) {
      error_ = "field 'model.vocab[\"" + vocab_key_ + "\"]' must be a non-negative 32-bit integer id";
    } else {
      error_ = "field 'model.merges[" + std::to_string(out_->merges.size() - (in(Kind::kMergePair) ? 1 : 0)) +
               "]' must be a \"left right\" string or a [left, right] pair of strings";
    }
    return false;
  }

  TokenizerJson* out_;
  std::vector<Frame> stack_;
  std::string vocab_key_;
  std::string error_;
};

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view text, const std::string& source) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return parse_error(source + ": not valid JSON (a NUL byte at byte " + std::to_string(nul) + ")");
  }
  TokenizerJson out;
  Handler handler(&out);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const Json::exception& e) {
    return parse_error(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!ok) return parse_error(source + ": " + (handler.error().empty() ? "not valid JSON" : handler.error()));
  if (out.vocab_pool.size() > UINT32_MAX || out.merge_pool.size() > UINT32_MAX) {
    return out_of_range(source + ": model.vocab or model.merges is larger than 4 GiB");
  }
  return out;
}

}  // namespace dc
