// API keys: `serve --api-key KEY` / `--api-key-file FILE` (several keys). Requests to protected routes must
// carry `Authorization: Bearer KEY`; keys are compared in time that does not depend on the guess, and never
// logged or echoed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/openai.h"

namespace dc::server {

class ApiKeys {
 public:
  // `keys` from --api-key, plus one key per line of `file` ("" = none; blank lines and lines starting with
  // '#' skipped, surrounding whitespace trimmed). Errors name the file and line, never the key.
  static Result<ApiKeys> load(const std::vector<std::string>& keys, const std::string& file);

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }
  // Whether `authorization` (the header's value) is "Bearer " and one of the keys; looks at every key.
  bool accepts(const std::string& authorization) const;
  // The 401 for a request without a valid key (OpenAI's error object), or nullopt when it has one.
  std::optional<ApiError> refuse(const std::string& authorization) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace dc::server
