// The OpenAI API mapping, as pure functions: request JSON → a validated ApiRequest (the public
// GenerationConfig plus the serving fields), and the response, stream-chunk and error objects of
// /v1/completions and /v1/chat/completions. No sockets here, so everything is unit-testable.
#pragma once

#include <diffucoder/diffucoder.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace dc::server {

enum class Endpoint { kCompletions, kChatCompletions };

// Server-side limits and defaults for request fields (each a 400 when exceeded).
struct RequestLimits {
  int64_t default_max_tokens = 128;   // when the request has no max_tokens
  int64_t max_tokens = 1024;          // the largest max_tokens (and steps) a request may ask for
  int64_t max_prompt_tokens = 4096;   // the longest prompt after tokenization (checked by the HTTP layer)
  int max_n = 8;                      // the largest n (completions per request)
  int max_stop = 4;                   // stop strings per request, as OpenAI
  bool fast = false;                  // `serve --fast`: requests that set none of block_length, cache,
                                      // threshold and factor decode in the fast mode (resolve_fast)
};

// A parsed, validated request. Prompt tokens are not known yet (the tokenizer runs in the HTTP layer).
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                  // as given ("" when absent); echoed in responses
  std::string prompt;                 // completions: the prompt text (unless prompt_ids)
  std::vector<int32_t> prompt_ids;    // completions: a prompt given as token ids
  bool has_prompt_ids = false;
  std::vector<diffucoder::Model::Message> messages;  // chat: the conversation (Model::apply_chat_template)
  int n = 1;
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool stream_canvas = false;         // extension: an `event: canvas` SSE event after every step
  bool canvas_changes = false;        // stream_canvas "changes": events after the first carry only what changed
  std::vector<std::string> stop;
  std::string user;
  diffucoder::GenerationConfig config;  // max_new_tokens = max_tokens, num_return_sequences = n; fast spelt out
};

// The OpenAI error object: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";  // invalid_request_error, not_found_error, server_error, ...
  std::string message;
  std::string param;  // the offending field ("" = null)
  std::string code;   // "" = null
  nlohmann::json to_json() const;
};

// A Status → ApiError: invalid_argument / parse_error / out_of_range → 400 with `param` taken from a leading
// "field: " of the message, not_found → 404, unimplemented → 400, anything else → 500 server_error.
ApiError api_error(const Status& status);
// The facade's Status (the same codes) as the server's.
Status from_public(const diffucoder::Status& status);

// Parses a request body. `base` carries the model's ids (Model::default_config()); the server
// defaults (deterministic, DiffuCoder-style: alg entropy, temperature 0, steps = max_tokens) are applied
// first, then every field the request sets. Unknown fields are ignored; fields OpenAI defines that change
// the output and that this server does not implement (logprobs, echo, best_of > 1, suffix, tools, penalties
// != 0, logit_bias) are refused. Errors name the field (status message "field: ...").
Result<ApiRequest> parse_request(Endpoint endpoint, const std::string& body, const diffucoder::GenerationConfig& base,
                                 const RequestLimits& limits);

// One finished choice.
struct Choice {
  std::string text;
  std::string finish_reason;  // "stop" (a stop token or string) or "length"
  int64_t completion_tokens = 0;  // tokens kept (before the stop)
};

// The identity a response carries: "cmpl-…" / "chatcmpl-…", the Unix time and the model name.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// The non-streaming response object (text_completion or chat.completion), with usage summed over choices.
nlohmann::json response_json(Endpoint endpoint, const ResponseMeta& meta, const std::vector<Choice>& choices,
                             int64_t prompt_tokens, const nlohmann::json& extension);

// A streaming chunk for choice `index`: `delta` text (chat: role "assistant" when `first`), and
// finish_reason ("" = null).
nlohmann::json chunk_json(Endpoint endpoint, const ResponseMeta& meta, int index, const std::string& delta,
                          bool first, const std::string& finish_reason);

// The final usage chunk of a stream with stream_options.include_usage (choices: []).
nlohmann::json usage_chunk_json(Endpoint endpoint, const ResponseMeta& meta, int64_t prompt_tokens,
                                int64_t completion_tokens);

// "data: <json>\n\n"; `event` non-empty adds an "event: <name>" line first.
std::string sse_event(const nlohmann::json& data, const std::string& event = "");

// Where text stops: the first occurrence of any stop string (npos when none).
size_t find_stop(const std::string& text, const std::vector<std::string>& stop);

// The byte length of the longest prefix of `text` that is safe to stream now: not ending inside a UTF-8
// sequence or a U+FFFD from a split byte-level token, and holding back a suffix that could begin a stop string.
size_t streamable_prefix(const std::string& text, const std::vector<std::string>& stop);

}  // namespace dc::server
