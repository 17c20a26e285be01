// Training data: JSONL of {"prompt", "completion"} or chat {"messages": [...]}, or plain text for
// continued pre-training; tokenised onto fixed-length canvases; a deterministic order from a seed.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/masked_diffusion.h"

namespace dc::train {

// Limits of training data (README "Limits"): the --data file's size (read whole) and the canvas length.
inline constexpr int64_t kMaxTrainDataBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxTrainSeqLen = int64_t{1} << 20;

struct DataOptions {
  int64_t seq_len = 256;     // canvas length L
  int32_t pad_token_id = 0;  // fills SFT canvases (DiffuCoder-Instruct: <|dlm_pad|>); scored like completion
  bool instruct_template = false;  // {"prompt"} wrapped by format_instruct_prompt, completion + "<|im_end|>"
};

struct Dataset {
  std::vector<TrainSequence> sequences;
  int64_t n_skipped = 0;    // examples whose prompt fills the whole canvas
  int64_t n_truncated = 0;  // examples whose completion was cut at the canvas end
};

// Reads `path`: a file ending in .jsonl / .json is JSON lines, each {"prompt": s, "completion": s} or
// {"messages": [{"role", "content"}, ...]} whose last message is the assistant's answer (the earlier
// ones form the prompt through the Qwen chat layout of tokenizer/chat.h, the answer gets "<|im_end|>");
// canvas = prompt ‖ completion ‖ pad… (prompt: loss_mask 0; completion and pad fill: 1). Any other file
// is plain text: tokenised whole and packed into canvases of seq_len tokens, every token scored (the
// last partial canvas is dropped). Errors name the file and line (bad JSON, missing field, no example).
Result<Dataset> load_dataset(const std::string& path, const Tokenizer& tokenizer, const DataOptions& options);

// Reads the JSON-lines file `path` (at most max_bytes, read whole) and calls fn(object, line number (1-based),
// "<path>:<line>") for each non-blank line in order, stopping at its first error. parse_error / invalid_argument
// naming the file and line for a line that is not JSON or not an object.
Status for_each_json_object(const std::string& path, int64_t max_bytes,
                            const std::function<Status(nlohmann::json&, int64_t, const std::string&)>& fn);

// The string field `key` of the JSON object `j`; invalid_argument "<where>: needs a string \"key\"".
Result<std::string> string_field(const nlohmann::json& j, const char* key, const std::string& where);

// A JSONL line's "messages": a non-empty array of {"role": s, "content": s} objects, in order (roles are
// checked by format_chat). Errors name `where` and the message index.
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::json& messages, const std::string& where);

// The example order: epoch e is a Fisher–Yates permutation of [0, n) drawn from hash_counters(seed, e, i).
// sample_at(cursor) = the example index of the cursor-th sample overall (epoch = cursor / n).
class DataOrder {
 public:
  DataOrder(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t sample_at(int64_t cursor);

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace dc::train
