// API keys: `serve --api-key KEY` / `--api-key-file FILE` (several keys). Requests to protected routes must
// carry `Authorization: Bearer KEY` (the scheme in any case, RFC 7235 §2.1; spaces or tabs after it); keys
// are compared in time that does not depend on the guess, and never logged or echoed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/openai.h"

namespace dc::server {

// The token of an `Authorization` value "Bearer TOKEN": the scheme in any case ("bearer", "BEARER"), then
// one or more spaces or tabs, then a non-empty token (surrounding whitespace trimmed); nullopt otherwise.
std::optional<std::string> bearer_token(const std::string& authorization);

class ApiKeys {
 public:
  // `keys` from --api-key, plus one key per line of `file` ("" = none; blank lines and lines starting with
  // '#' skipped, surrounding whitespace trimmed). Errors name the file and line, never the key.
  static Result<ApiKeys> load(const std::vector<std::string>& keys, const std::string& file);

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }
  // Whether `authorization` (the header's value) is a Bearer token (bearer_token) that is one of the keys;
  // looks at every key.
  bool accepts(const std::string& authorization) const;
  // The 401 for a request without a valid key (OpenAI's error object), or nullopt when it has one.
  std::optional<ApiError> refuse(const std::string& authorization) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace dc::server
