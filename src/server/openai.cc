// OpenAI request parsing / validation into the public GenerationConfig, and the response, chunk and error objects.
#include "server/openai.h"

#include <cmath>

namespace dc::server {
namespace {

using nlohmann::json;

Status field_error(const std::string& field, const std::string& what) { return invalid_argument(field + ": " + what); }

std::string type_name(const json& v) { return v.is_null() ? "null" : v.type_name(); }

// An algorithm or cache name the facade knows: check_config's error for it alone (naming the field).
Status check_name(std::string diffucoder::GenerationConfig::*field, const std::string& name) {
  diffucoder::GenerationConfig probe;
  probe.*field = name;
  return from_public(diffucoder::check_config(probe));
}

Result<int64_t> get_int(const json& body, const std::string& field, int64_t lo, int64_t hi) {
  const json& v = body[field];
  if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
      std::fabs(v.get<double>()) >= 9.2e18)  // an integer too large for the JSON parser's 64 bits
    return field_error(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  if (!v.is_number_integer()) return field_error(field, "must be an integer, got " + type_name(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return field_error(field, "is out of range");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    return field_error(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                                  std::to_string(x));
  return x;
}

Result<double> get_number(const json& body, const std::string& field, double lo, double hi) {
  const json& v = body[field];
  if (!v.is_number()) return field_error(field, "must be a number, got " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    return field_error(field, "must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + v.dump());
  return x;
}

Result<bool> get_bool(const json& body, const std::string& field) {
  const json& v = body[field];
  if (!v.is_boolean()) return field_error(field, "must be true or false, got " + type_name(v));
  return v.get<bool>();
}

Result<std::string> get_string(const json& body, const std::string& field) {
  const json& v = body[field];
  if (!v.is_string()) return field_error(field, "must be a string, got " + type_name(v));
  return v.get<std::string>();
}

bool present(const json& body, const char* field) { return body.contains(field) && !body[field].is_null(); }

// An optional float field: `out` is set when the field is present (and in [lo, hi]), else left alone.
Status read_float(const json& body, const char* field, double lo, double hi, float& out) {
  if (!present(body, field)) return Status();
  DC_ASSIGN_OR_RETURN(double x, get_number(body, field, lo, hi));
  out = static_cast<float>(x);
  return Status();
}

Status parse_prompt(const json& v, ApiRequest& r) {
  if (v.is_string()) {
    r.prompt = v.get<std::string>();
    return Status::ok_status();
  }
  if (v.is_array() && !v.empty()) {
    if (v.size() == 1 && v[0].is_string()) {
      r.prompt = v[0].get<std::string>();
      return Status::ok_status();
    }
    if (v[0].is_string()) return field_error("prompt", "one prompt per request (use n for several completions)");
    if (v[0].is_array()) return field_error("prompt", "one prompt per request (an array of token arrays was given)");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 || v[i].get<int64_t>() > INT32_MAX)
        return field_error("prompt", "token array entry " + std::to_string(i) + " is not a token id: " + v[i].dump());
      r.prompt_ids.push_back(v[i].get<int32_t>());
    }
    r.has_prompt_ids = true;
    return Status::ok_status();
  }
  return field_error("prompt", "must be a string, [string] or an array of token ids");
}

Status parse_messages(const json& v, ApiRequest& r) {
  if (!v.is_array() || v.empty()) return field_error("messages", "must be a non-empty array of messages");
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return field_error(where, "must be an object with role and content");
    if (!m.contains("role") || !m["role"].is_string()) return field_error(where + ".role", "must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant")
      return field_error(where + ".role", "must be system, developer, user or assistant, got '" + role + "'");
    std::string content;
    const json& c = m.contains("content") ? m["content"] : json();
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {  // content parts: only text
      for (size_t p = 0; p < c.size(); ++p) {
        const json& part = c[p];
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return field_error(where + ".content[" + std::to_string(p) + "]", "only text parts are supported");
        content += part["text"].get<std::string>();
      }
    } else {
      return field_error(where + ".content", "must be a string or an array of text parts");
    }
    r.messages.push_back({role, content});
  }
  return Status::ok_status();
}

Status refuse_unsupported(const json& body, Endpoint endpoint) {
  for (const char* f : {"logprobs", "top_logprobs", "echo", "suffix", "tools", "functions", "logit_bias"}) {
    if (!present(body, f)) continue;
    const json& v = body[f];
    if (v == false || (v.is_number_integer() && v.get<int64_t>() == 0 && std::string(f) != "logprobs")) continue;
    if (std::string(f) == "logprobs" && endpoint == Endpoint::kCompletions && v.is_number_integer() &&
        v.get<int64_t>() == 0)
      continue;
    if (v.is_array() && v.empty()) continue;
    if (v.is_object() && v.empty()) continue;
    return unimplemented(std::string(f) + ": not supported by this server");
  }
  for (const char* f : {"presence_penalty", "frequency_penalty"}) {
    if (present(body, f) && (!body[f].is_number() || body[f].get<double>() != 0.0))
      return unimplemented(std::string(f) + ": not supported by this server (only 0)");
  }
  if (present(body, "best_of") && !(body["best_of"].is_number_integer() && body["best_of"].get<int64_t>() == 1))
    return unimplemented("best_of: not supported by this server (only 1)");
  return Status::ok_status();
}

// The body as a JSON object; a parse error names the position and what the parser read there, and a number
// past double's range names its field.
Result<json> parse_body(const std::string& body_text) {
  if (const size_t nul = body_text.find('\0'); nul != std::string::npos)
    return parse_error("body: not valid JSON (a NUL byte at byte " + std::to_string(nul) + ")");
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {  // the parser's message names the position and what it read there
    std::string what = e.what();
    if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    // A number past double's range (1e400) is valid JSON the parser cannot hold: name its field.
    static const std::string kOverflow = "number overflow parsing '";
    if (const size_t o = what.find(kOverflow); o != std::string::npos) {
      const std::string literal = what.substr(o + kOverflow.size(), what.find('\'', o + kOverflow.size()) - o - kOverflow.size());
      const size_t at = literal.empty() ? std::string::npos : body_text.find(literal);
      const size_t colon = at == std::string::npos ? at : body_text.rfind(':', at);
      const size_t close = colon == std::string::npos ? colon : body_text.rfind('"', colon);
      const size_t open = close == std::string::npos || close == 0 ? std::string::npos : body_text.rfind('"', close - 1);
      if (open != std::string::npos) {
        const std::string field = body_text.substr(open + 1, close - open - 1);
        if (!field.empty() && field.find_first_of(" \\\"") == std::string::npos)
          return invalid_argument(field + ": the number " + literal + " is out of range");
      }
    }
    return parse_error("body: not valid JSON (" + what + ")");
  }
  if (!body.is_object()) return parse_error("body: must be a JSON object, got " + type_name(body));
  return body;
}

// max_tokens (or max_completion_tokens) into p.max_new_tokens, steps, temperature, top_p, top_k,
// n and seed, in that order.
Status parse_sampling(const json& body, const RequestLimits& limits, ApiRequest& r) {
  diffucoder::GenerationConfig& p = r.config;
  int64_t max_tokens = limits.default_max_tokens;
  const char* max_field = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (present(body, max_field)) {
    DC_ASSIGN_OR_RETURN(max_tokens, get_int(body, max_field, 1, limits.max_tokens));
  }
  p.max_new_tokens = max_tokens;
  p.steps = static_cast<int>(max_tokens);
  if (present(body, "steps")) {
    DC_ASSIGN_OR_RETURN(int64_t steps, get_int(body, "steps", 1, limits.max_tokens));
    p.steps = static_cast<int>(steps);
  }
  DC_RETURN_IF_ERROR(read_float(body, "temperature", 0.0, 2.0, p.temperature));
  if (present(body, "top_p")) {
    const json& v = body["top_p"];
    if (!v.is_number()) return field_error("top_p", "must be a number, got " + type_name(v));
    const double t = v.get<double>();
    if (!(t > 0.0 && t <= 1.0)) return field_error("top_p", "must be in (0, 1], got " + v.dump());
    p.top_p = static_cast<float>(t);
  }
  if (present(body, "top_k")) {
    DC_ASSIGN_OR_RETURN(p.top_k, get_int(body, "top_k", -1, INT32_MAX));
  }
  if (present(body, "n")) {
    DC_ASSIGN_OR_RETURN(int64_t n, get_int(body, "n", 1, limits.max_n));
    r.n = static_cast<int>(n);
  }
  p.num_return_sequences = r.n;
  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()))
      return field_error("seed", "is out of range: must be an integer in [-2^63, 2^64), got " + v.dump());
    if (!v.is_number_integer()) return field_error("seed", "must be an integer, got " + type_name(v));
    p.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }
  return Status::ok_status();
}

// stop: a string or an array of up to limits.max_stop non-empty strings.
Status parse_stop(const json& v, const RequestLimits& limits, ApiRequest& r) {
  if (v.is_string()) {
    r.stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& s : v) {
      if (!s.is_string()) return field_error("stop", "must be a string or an array of strings");
      r.stop.push_back(s.get<std::string>());
    }
  } else {
    return field_error("stop", "must be a string or an array of strings, got " + type_name(v));
  }
  if (static_cast<int>(r.stop.size()) > limits.max_stop)
    return field_error("stop", "at most " + std::to_string(limits.max_stop) + " stop strings");
  for (const std::string& s : r.stop)
    if (s.empty()) return field_error("stop", "stop strings must not be empty");
  return Status::ok_status();
}

// stream, stream_options.include_usage and stream_canvas (true, false or "changes"; it needs stream).
Status parse_streaming(const json& body, ApiRequest& r) {
  if (present(body, "stream")) {
    DC_ASSIGN_OR_RETURN(r.stream, get_bool(body, "stream"));
  }
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return field_error("stream_options", "must be an object");
    if (present(so, "include_usage")) {
      DC_ASSIGN_OR_RETURN(r.include_usage, get_bool(so, "include_usage"));
    }
  }
  if (present(body, "stream_canvas")) {
    const json& v = body["stream_canvas"];
    if (v.is_string() && v.get<std::string>() == "changes") {
      r.stream_canvas = r.canvas_changes = true;
    } else if (v.is_boolean()) {
      r.stream_canvas = v.get<bool>();
    } else {
      return field_error("stream_canvas", "must be true, false or \"changes\", got " + (v.is_string() ? v.dump() : type_name(v)));
    }
  }
  if (r.stream_canvas && !r.stream) return field_error("stream_canvas", "needs stream: true");
  return Status::ok_status();
}

// The diffusion extensions: alg, alg_temp, eps, block_length, threshold, factor, cache, refresh_every; `serve --fast`'s mode
// when the request sets none of block_length, cache, threshold and factor.
Status parse_diffusion(const json& body, const RequestLimits& limits, diffucoder::GenerationConfig& p) {
  if (present(body, "alg")) {
    DC_ASSIGN_OR_RETURN(p.alg, get_string(body, "alg"));
    DC_RETURN_IF_ERROR(check_name(&diffucoder::GenerationConfig::alg, p.alg));
  }
  DC_RETURN_IF_ERROR(read_float(body, "alg_temp", 0.0, 1e6, p.alg_temp));
  DC_RETURN_IF_ERROR(read_float(body, "eps", 0.0, 1.0, p.eps));
  if (present(body, "block_length")) {
    DC_ASSIGN_OR_RETURN(p.block_length, get_int(body, "block_length", 0, limits.max_tokens));
  }
  DC_RETURN_IF_ERROR(read_float(body, "threshold", 0.0, 1.0, p.threshold));
  DC_RETURN_IF_ERROR(read_float(body, "factor", 0.0, 1e6, p.factor));
  if (present(body, "cache")) {
    DC_ASSIGN_OR_RETURN(p.cache, get_string(body, "cache"));
    DC_RETURN_IF_ERROR(check_name(&diffucoder::GenerationConfig::cache, p.cache));
  }
  if (present(body, "refresh_every")) {
    DC_ASSIGN_OR_RETURN(int64_t every, get_int(body, "refresh_every", 1, limits.max_tokens));
    p.refresh_every = static_cast<int>(every);
  }
  if (limits.fast && !present(body, "block_length") && !present(body, "cache") && !present(body, "threshold") &&
      !present(body, "factor")) {
    p.fast = true;
    diffucoder::Result<diffucoder::GenerationConfig> resolved = diffucoder::resolve_fast(p);
    if (!resolved.ok()) return from_public(resolved.status());
    p = std::move(resolved).value();
  }
  return Status::ok_status();
}

}  // namespace

nlohmann::json ApiError::to_json() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

ApiError api_error(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kParseError:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented: {
      e.http_status = 400;
      const size_t colon = e.message.find(": ");
      if (colon != std::string::npos && colon > 0 &&
          e.message.find_first_of(" \"'", 0) >= colon)  // "field: ..." or "messages[0].role: ..."
        e.param = e.message.substr(0, colon);
      break;
    }
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case StatusCode::kFailedPrecondition:  // valid, but not now: the client may retry
      e.http_status = 409;
      e.type = "conflict_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
  }
  return e;
}

Status from_public(const diffucoder::Status& status) {
  return status.ok() ? Status::ok_status() : Status(static_cast<StatusCode>(status.code()), status.message());
}

Result<ApiRequest> parse_request(Endpoint endpoint, const std::string& body_text, const diffucoder::GenerationConfig& base,
                                 const RequestLimits& limits) {
  DC_ASSIGN_OR_RETURN(const json body, parse_body(body_text));
  DC_RETURN_IF_ERROR(refuse_unsupported(body, endpoint));

  ApiRequest r;
  r.endpoint = endpoint;
  diffucoder::GenerationConfig& p = r.config;
  p = base;
  p.alg = "entropy";  // the server's defaults: deterministic, as the CLI's
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = 50;
  p.max_length.reset();

  if (present(body, "model")) {
    DC_ASSIGN_OR_RETURN(r.model, get_string(body, "model"));
  }
  if (endpoint == Endpoint::kCompletions) {
    if (!present(body, "prompt")) return field_error("prompt", "is required");
    DC_RETURN_IF_ERROR(parse_prompt(body["prompt"], r));
  } else {
    if (!present(body, "messages")) return field_error("messages", "is required");
    DC_RETURN_IF_ERROR(parse_messages(body["messages"], r));
  }
  DC_RETURN_IF_ERROR(parse_sampling(body, limits, r));
  if (present(body, "stop")) DC_RETURN_IF_ERROR(parse_stop(body["stop"], limits, r));
  DC_RETURN_IF_ERROR(parse_streaming(body, r));
  if (present(body, "user")) {
    DC_ASSIGN_OR_RETURN(r.user, get_string(body, "user"));
  }
  DC_RETURN_IF_ERROR(parse_diffusion(body, limits, p));
  // Ranges and one step per block (the vocabulary is checked with the prompt).
  DC_RETURN_IF_ERROR(from_public(diffucoder::check_config(p)));
  return r;
}

nlohmann::json response_json(Endpoint endpoint, const ResponseMeta& meta, const std::vector<Choice>& choices,
                             int64_t prompt_tokens, const nlohmann::json& extension) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json out = {{"id", meta.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint", nullptr}};
  json list = json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    completion_tokens += c.completion_tokens;
    json item = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}};
    if (chat) {
      item["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      item["text"] = c.text;
    }
    list.push_back(std::move(item));
  }
  out["choices"] = std::move(list);
  out["usage"] = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
  if (!extension.is_null()) out["diffusion"] = extension;
  return out;
}

nlohmann::json chunk_json(Endpoint endpoint, const ResponseMeta& meta, int index, const std::string& delta, bool first,
                          const std::string& finish_reason) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  json choice = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  if (chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || first) d["content"] = delta;
    choice["delta"] = std::move(d);
  } else {
    choice["text"] = delta;
  }
  return json{{"id", meta.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"system_fingerprint", nullptr},
              {"choices", json::array({choice})}};
}

nlohmann::json usage_chunk_json(Endpoint endpoint, const ResponseMeta& meta, int64_t prompt_tokens,
                                int64_t completion_tokens) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  return json{{"id", meta.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", json::array()},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}}}};
}

std::string sse_event(const nlohmann::json& data, const std::string& event) {
  std::string s;
  if (!event.empty()) s += "event: " + event + "\n";
  s += "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  return s;
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stop) {
  size_t best = std::string::npos;
  for (const std::string& s : stop) {
    const size_t at = text.find(s);
    if (at < best) best = at;
  }
  return best;
}

size_t streamable_prefix(const std::string& text, const std::vector<std::string>& stop) {
  size_t end = text.size();
  // A trailing U+FFFD comes from a token that split a UTF-8 sequence; the next token may complete it.
  static const std::string kReplacement = "\xEF\xBF\xBD";
  while (end >= 3 && text.compare(end - 3, 3, kReplacement) == 0) end -= 3;
  // Never end inside a UTF-8 sequence.
  size_t lead = end;
  while (lead > 0 && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0 && lead <= end) {
    const unsigned char c = static_cast<unsigned char>(text[lead - 1]);
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > 1 && end - (lead - 1) < need) end = lead - 1;
  }
  // Hold back a suffix that could be the beginning of a stop string.
  for (const std::string& s : stop) {
    for (size_t len = std::min(s.size() - 1, end); len > 0; --len) {
      if (text.compare(end - len, len, s, 0, len) == 0) {
        end -= len;
        break;
      }
    }
  }
  return end;
}

}  // namespace dc::server
