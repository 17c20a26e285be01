// libFuzzer target for the OpenAI request parser of `diffucoder serve` (server/openai.h): arbitrary bodies
// for both endpoints (the first byte picks one). A request is either refused with a message naming a field
// (or "body") or accepted with every value inside the server's limits and a config check_config accepts, fast spelt out.
// Seeds: tests/fuzz/seeds/openai_request/. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto endpoint = (data[0] & 1) ? dc::server::Endpoint::kChatCompletions : dc::server::Endpoint::kCompletions;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  diffucoder::GenerationConfig base;
  base.mask_token_id = 151666;
  base.pad_token_id = 151643;
  dc::server::RequestLimits limits;
  auto r = dc::server::parse_request(endpoint, body, base, limits);
  if (!r.ok()) {
    if (r.status().message().empty() || r.status().message().find(": ") == std::string::npos) __builtin_trap();
    const dc::server::ApiError e = dc::server::api_error(r.status());
    if (e.http_status < 400 || e.http_status >= 500) __builtin_trap();  // a bad request is never a 5xx
    return 0;
  }
  const diffucoder::GenerationConfig& p = r->config;
  if (!diffucoder::check_config(p).ok() || p.fast) __builtin_trap();
  if (!p.max_new_tokens || *p.max_new_tokens < 1 || *p.max_new_tokens > limits.max_tokens) __builtin_trap();
  if (p.steps < 1 || p.steps > limits.max_tokens) __builtin_trap();
  if (r->n < 1 || r->n > limits.max_n || static_cast<int>(r->stop.size()) > limits.max_stop) __builtin_trap();
  if (r->endpoint == dc::server::Endpoint::kChatCompletions && r->messages.empty()) __builtin_trap();
  return 0;
}
