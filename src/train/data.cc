// load_dataset (JSONL prompt/completion, chat messages, plain text) and the seeded example order.
#include "train/data.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/mapped_file.h"
#include "tokenizer/chat.h"
#include "train/rng.h"

namespace dc::train {
namespace {

using Json = nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// prompt ‖ completion on a canvas of o.seq_len, padded with o.pad_token_id.
void add_canvas(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion, const DataOptions& o,
                Dataset& ds) {
  const int64_t L = o.seq_len, np = static_cast<int64_t>(prompt.size());
  if (np >= L) {
    ++ds.n_skipped;
    return;
  }
  TrainSequence s;
  s.tokens.assign(prompt.begin(), prompt.end());
  s.loss_mask.assign(np, 0);
  const int64_t nc = std::min<int64_t>(L - np, static_cast<int64_t>(completion.size()));
  if (nc < static_cast<int64_t>(completion.size())) ++ds.n_truncated;
  s.tokens.insert(s.tokens.end(), completion.begin(), completion.begin() + nc);
  s.tokens.resize(L, o.pad_token_id);
  s.loss_mask.resize(L, 1);
  ds.sequences.push_back(std::move(s));
}

// A text of more than this many bytes encodes to more than seq_len tokens (a token has at most
// max_token_bytes bytes), so a longer prompt cannot fit and a longer completion is cut anyway.
int64_t fit_bytes(const Tokenizer& tok, const DataOptions& o) { return o.seq_len * tok.max_token_bytes(); }

// `text` cut to at most 2 · fit_bytes bytes at a UTF-8 character boundary: the tokens of its first
// seq_len positions are those of the whole text (the margin keeps the cut far from them).
std::string_view cut_long_text(std::string_view text, int64_t fit) {
  const size_t keep = static_cast<size_t>(2 * fit);
  if (text.size() <= keep) return text;
  size_t end = keep;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

Status load_jsonl(const std::string& path, const Tokenizer& tok, const DataOptions& o, Dataset& ds) {
  const int64_t fit = fit_bytes(tok, o);
  return for_each_json_object(path, kMaxTrainDataBytes, [&](Json& j, int64_t, const std::string& where) -> Status {
    std::string prompt, completion;
    if (j.contains("messages")) {
      DC_ASSIGN_OR_RETURN(std::vector<ChatMessage> history, parse_chat_messages(j["messages"], where));
      if (history.back().role != "assistant" || history.size() < 2)
        return invalid_argument(where + ": the last message must be the assistant's answer, after at least one other");
      completion = history.back().content + "<|im_end|>";
      history.pop_back();
      auto formatted = format_chat(history, true);
      if (!formatted.ok()) return invalid_argument(where + ": " + formatted.status().message());
      prompt = *formatted;
    } else {
      DC_ASSIGN_OR_RETURN(prompt, string_field(j, "prompt", where));
      DC_ASSIGN_OR_RETURN(completion, string_field(j, "completion", where));
      if (o.instruct_template) {
        prompt = format_instruct_prompt(prompt);
        completion += "<|im_end|>";
      }
    }
    if (static_cast<int64_t>(prompt.size()) > fit) {  // cannot fit the canvas: skipped, as add_canvas would
      ++ds.n_skipped;
      return Status();
    }
    auto p = tok.encode(prompt);
    if (!p.ok()) return invalid_argument(where + ": " + p.status().message());
    auto c = tok.encode(cut_long_text(completion, fit));
    if (!c.ok()) return invalid_argument(where + ": " + c.status().message());
    add_canvas(*p, *c, o, ds);
    return Status();
  });
}

Status load_text(const std::string& path, const Tokenizer& tok, const DataOptions& o, Dataset& ds) {
  DC_ASSIGN_OR_RETURN(const std::string text, read_text_file(path, kMaxTrainDataBytes));
  auto ids = tok.encode(text);
  if (!ids.ok()) return invalid_argument(path + ": " + ids.status().message());
  const int64_t L = o.seq_len;
  for (int64_t b = 0; b + L <= static_cast<int64_t>(ids->size()); b += L) {
    TrainSequence s;
    s.tokens.assign(ids->begin() + b, ids->begin() + b + L);
    s.loss_mask.assign(L, 1);
    ds.sequences.push_back(std::move(s));
  }
  return Status();
}

}  // namespace

Status for_each_json_object(const std::string& path, int64_t max_bytes,
                            const std::function<Status(Json&, int64_t, const std::string&)>& fn) {
  DC_ASSIGN_OR_RETURN(const std::string text, read_text_file(path, max_bytes));
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    Json j;
    try {
      j = Json::parse(line);
    } catch (const std::exception& e) {
      return parse_error(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object()) return invalid_argument(where + ": each line must be a JSON object");
    DC_RETURN_IF_ERROR(fn(j, line_no, where));
  }
  return Status();
}

Result<std::string> string_field(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return invalid_argument(where + ": needs a string \"" + key + "\"");
  return it->get<std::string>();
}

Result<std::vector<ChatMessage>> parse_chat_messages(const Json& msgs, const std::string& where) {
  if (!msgs.is_array() || msgs.empty()) return invalid_argument(where + ": \"messages\" must be a non-empty array");
  std::vector<ChatMessage> history;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string at = where + " messages[" + std::to_string(i) + "]";
    if (!msgs[i].is_object()) return invalid_argument(at + " is not an object");
    DC_ASSIGN_OR_RETURN(std::string role, string_field(msgs[i], "role", at));
    DC_ASSIGN_OR_RETURN(std::string content, string_field(msgs[i], "content", at));
    history.push_back({role, content});
  }
  return history;
}

Result<Dataset> load_dataset(const std::string& path, const Tokenizer& tokenizer, const DataOptions& o) {
  if (o.seq_len < 2) return invalid_argument("--seq-len must be at least 2");
  if (o.seq_len > kMaxTrainSeqLen)
    return invalid_argument("--seq-len must be at most " + std::to_string(kMaxTrainSeqLen));
  Dataset ds;
  if (ends_with(path, ".jsonl") || ends_with(path, ".json")) {
    DC_RETURN_IF_ERROR(load_jsonl(path, tokenizer, o, ds));
  } else {
    DC_RETURN_IF_ERROR(load_text(path, tokenizer, o, ds));
  }
  if (ds.sequences.empty())
    return invalid_argument(path + ": no training example fits a canvas of " + std::to_string(o.seq_len) +
                            " tokens (" + std::to_string(ds.n_skipped) + " prompts too long; plain text needs at least " +
                            std::to_string(o.seq_len) + " tokens)");
  return ds;
}

int64_t DataOrder::sample_at(int64_t cursor) {
  const int64_t epoch = cursor / n_;
  if (epoch != epoch_) {
    perm_.resize(n_);
    for (int64_t i = 0; i < n_; ++i) perm_[i] = i;
    for (int64_t i = n_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(hash_counters(seed_, static_cast<uint64_t>(epoch), i) % (i + 1));
      std::swap(perm_[i], perm_[j]);
    }
    epoch_ = epoch;
  }
  return perm_[cursor % n_];
}

}  // namespace dc::train
