// ApiKeys: loading, and the Bearer check with a comparison whose time depends only on the configured keys.
#include "server/auth.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <string_view>

namespace dc::server {
namespace {

constexpr size_t kMaxKeyBytes = 256;
constexpr size_t kMaxKeyFileBytes = size_t{1} << 20;

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// A key must fit in a header value: printable ASCII without spaces.
Status check_key(const std::string& key, const std::string& where) {
  if (key.empty()) return invalid_argument(where + ": the API key is empty");
  if (key.size() > kMaxKeyBytes)
    return invalid_argument(where + ": the API key is longer than " + std::to_string(kMaxKeyBytes) + " bytes");
  for (char c : key)
    if (c <= ' ' || c > '~')
      return invalid_argument(where + ": the API key has a space or a character outside printable ASCII");
  return Status::ok_status();
}

// 1 when equal; time depends on the length of `key` only (not on where `guess` differs).
unsigned equal_in_constant_time(const std::string& key, const std::string& guess) {
  unsigned diff = key.size() != guess.size() ? 1u : 0u;
  const size_t n = guess.empty() ? 1 : guess.size();
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = guess.empty() ? 0 : static_cast<unsigned char>(guess[i % n]);
    diff |= static_cast<unsigned>(static_cast<unsigned char>(key[i]) ^ g);
  }
  return diff == 0 ? 1u : 0u;
}

}  // namespace

Result<ApiKeys> ApiKeys::load(const std::vector<std::string>& keys, const std::string& file) {
  ApiKeys out;
  for (const std::string& k : keys) {
    DC_RETURN_IF_ERROR(check_key(k, "--api-key"));
    out.keys_.push_back(k);
  }
  if (file.empty()) return out;
  struct stat st {};
  if (stat(file.c_str(), &st) != 0) return not_found("--api-key-file " + file + ": cannot read it (no such file)");
  if (!S_ISREG(st.st_mode)) return invalid_argument("--api-key-file " + file + ": not a regular file");
  if (static_cast<size_t>(st.st_size) > kMaxKeyFileBytes)
    return invalid_argument("--api-key-file " + file + ": larger than 1 MiB");
  std::ifstream in(file);
  if (!in) return io_error("--api-key-file " + file + ": cannot open it (permissions?)");
  size_t from_file = 0;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string key = trimmed(line);
    if (key.empty() || key[0] == '#') continue;
    DC_RETURN_IF_ERROR(check_key(key, "--api-key-file " + file + " line " + std::to_string(line_no)));
    out.keys_.push_back(key);
    ++from_file;
  }
  if (from_file == 0) return invalid_argument("--api-key-file " + file + ": no key in it (one key per line)");
  return out;
}

std::optional<std::string> bearer_token(const std::string& authorization) {
  static constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return std::nullopt;
  const char gap = authorization[kScheme.size()];
  if (gap != ' ' && gap != '\t') return std::nullopt;  // "Bearerx" is another scheme
  std::string token = trimmed(authorization.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

bool ApiKeys::accepts(const std::string& authorization) const {
  const std::optional<std::string> guess = bearer_token(authorization);
  if (!guess) return false;
  unsigned found = 0;
  for (const std::string& key : keys_) found |= equal_in_constant_time(key, *guess);
  return found != 0;
}

std::optional<ApiError> ApiKeys::refuse(const std::string& authorization) const {
  if (keys_.empty() || accepts(authorization)) return std::nullopt;
  ApiError e;
  e.http_status = 401;
  e.type = "invalid_request_error";
  e.code = "invalid_api_key";
  if (authorization.empty()) {
    e.message = "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY).";
  } else if (!bearer_token(authorization)) {
    e.message = "Authorization: expected 'Bearer YOUR_KEY'.";
  } else {
    e.message = "Incorrect API key provided.";
  }
  return e;
}

}  // namespace dc::server
