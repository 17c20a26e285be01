// The OpenAI mapping without sockets: request parsing and validation (types, ranges, unsupported fields),
// error objects, response / chunk schemas, and the streaming helpers (stop strings, UTF-8 hold-back).
#include <gtest/gtest.h>

#include "server/openai.h"

namespace dc::server {
namespace {

using nlohmann::json;

Result<ApiRequest> parse(Endpoint e, const json& body, RequestLimits limits = {}) {
  return parse_request(e, body.dump(), diffucoder::GenerationConfig{}, limits);
}

std::string param_of(const Result<ApiRequest>& r) { return api_error(r.status()).param; }

TEST(OpenAiParse, CompletionDefaultsAndFields) {
  auto r = parse(Endpoint::kCompletions, {{"prompt", "def f():"}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt, "def f():");
  EXPECT_EQ(r->config.max_new_tokens.value(), 128);
  EXPECT_EQ(r->config.steps, 128);
  EXPECT_EQ(r->config.alg, "entropy");
  EXPECT_EQ(r->config.temperature, 0.0f);
  EXPECT_EQ(r->n, 1);
  EXPECT_FALSE(r->stream);

  r = parse(Endpoint::kCompletions, {{"prompt", {"x"}}, {"max_tokens", 32}, {"steps", 16}, {"temperature", 0.4},
                                     {"top_p", 0.95}, {"n", 3}, {"seed", 7}, {"stop", "\n\n"}, {"stream", true},
                                     {"stream_options", {{"include_usage", true}}}, {"user", "u"},
                                     {"alg", "maskgit_plus"}, {"alg_temp", 0.5}, {"top_k", 0},
                                     {"block_length", 8}, {"frequency_penalty", 0}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config.max_new_tokens.value(), 32);
  EXPECT_EQ(r->config.steps, 16);
  EXPECT_FLOAT_EQ(r->config.temperature, 0.4f);
  EXPECT_FLOAT_EQ(r->config.top_p, 0.95f);
  EXPECT_EQ(r->config.num_return_sequences, 3);
  EXPECT_EQ(r->config.seed, 7u);
  EXPECT_EQ(r->stop, std::vector<std::string>{"\n\n"});
  EXPECT_TRUE(r->stream && r->include_usage);
  EXPECT_EQ(r->config.alg, "maskgit_plus");
  EXPECT_EQ(r->config.block_length, 8);
  EXPECT_EQ(r->user, "u");

  r = parse(Endpoint::kCompletions, {{"prompt", {1, 2, 3}}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->has_prompt_ids);
  EXPECT_EQ(r->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST(OpenAiParse, ChatMessages) {
  auto r = parse(Endpoint::kChatCompletions,
                 {{"messages", {{{"role", "developer"}, {"content", "be brief"}},
                                {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "ab");
  EXPECT_EQ(param_of(parse(Endpoint::kChatCompletions, {{"messages", json::array()}})), "messages");
  EXPECT_EQ(param_of(parse(Endpoint::kChatCompletions, {{"messages", {{{"role", "tool"}, {"content", "x"}}}}})),
            "messages[0].role");
  EXPECT_EQ(param_of(parse(Endpoint::kChatCompletions, {{"messages", {{{"role", "user"}, {"content", 5}}}}})),
            "messages[0].content");
  EXPECT_EQ(param_of(parse(Endpoint::kChatCompletions, {{"prompt", "x"}})), "messages");
}

TEST(OpenAiParse, RejectsBadTypesAndRangesNamingTheField) {
  const json base = {{"prompt", "x"}};
  struct Case {
    const char* field;
    json value;
  };
  const Case cases[] = {{"max_tokens", 0},        {"max_tokens", 2.5},     {"max_tokens", "8"},  {"max_tokens", 5000},
                        {"temperature", -1},      {"temperature", "hot"},  {"top_p", 0},         {"top_p", 1.5},
                        {"n", 0},                 {"n", 99},               {"seed", "s"},        {"stop", 5},
                        {"stop", {"a", "b", "c", "d", "e"}},               {"stop", {""}},       {"stream", "yes"},
                        {"steps", 0},             {"alg", "best"},         {"alg_temp", -1},     {"block_length", -1},
                        {"threshold", 2},         {"user", 1},             {"model", 3},         {"stream_canvas", true}};
  for (const Case& c : cases) {
    json body = base;
    body[c.field] = c.value;
    auto r = parse(Endpoint::kCompletions, body);
    ASSERT_FALSE(r.ok()) << c.field << " = " << c.value.dump();
    const ApiError e = api_error(r.status());
    EXPECT_EQ(e.http_status, 400) << c.field;
    EXPECT_EQ(e.param, c.field) << r.status().message();
  }
  EXPECT_EQ(param_of(parse(Endpoint::kCompletions, json::object())), "prompt");
  EXPECT_EQ(param_of(parse(Endpoint::kCompletions, {{"prompt", {"a", "b"}}})), "prompt");
  EXPECT_EQ(param_of(parse(Endpoint::kCompletions, {{"prompt", {1, -2}}})), "prompt");
}

TEST(OpenAiParse, MalformedBodiesAndUnsupportedFields) {
  for (const char* body : {"", "{", "[1,2]", "\"text\"", "null", "{\"prompt\": \"x\",}", "\xff\xfe"}) {
    auto r = parse_request(Endpoint::kCompletions, body, diffucoder::GenerationConfig{}, RequestLimits{});
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(api_error(r.status()).http_status, 400);
    EXPECT_EQ(api_error(r.status()).param, "body");
  }
  for (const json& extra : {json{{"logprobs", 2}}, json{{"echo", true}}, json{{"best_of", 3}},
                            json{{"presence_penalty", 0.5}}, json{{"logit_bias", {{"1", 5}}}}, json{{"cache", "paged"}}}) {
    json body = {{"prompt", "x"}};
    body.update(extra);
    auto r = parse(Endpoint::kCompletions, body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(api_error(r.status()).http_status, 400);
    EXPECT_EQ(api_error(r.status()).param, extra.begin().key());
  }
  // Defaults clients send are accepted; unknown fields are ignored; null means absent.
  auto r = parse(Endpoint::kCompletions, {{"prompt", "x"}, {"logprobs", nullptr}, {"echo", false}, {"best_of", 1},
                                          {"presence_penalty", 0}, {"some_new_field", 1}, {"max_tokens", nullptr}});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

TEST(OpenAiParse, LimitsAreConfigurable) {
  RequestLimits limits;
  limits.max_tokens = 16;
  limits.max_n = 2;
  limits.default_max_tokens = 4;
  auto r = parse(Endpoint::kCompletions, {{"prompt", "x"}}, limits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.max_new_tokens.value(), 4);
  EXPECT_EQ(param_of(parse(Endpoint::kCompletions, {{"prompt", "x"}, {"max_tokens", 17}}, limits)), "max_tokens");
  EXPECT_EQ(param_of(parse(Endpoint::kCompletions, {{"prompt", "x"}, {"n", 3}}, limits)), "n");
  EXPECT_EQ(param_of(parse(Endpoint::kCompletions, {{"prompt", "x"}, {"max_tokens", 8}, {"block_length", 2},
                                                    {"steps", 3}}, limits)), "steps");
}

TEST(OpenAiResponse, SchemaOfCompletionAndChat) {
  const ResponseMeta meta{"cmpl-1", 1700000000, "m"};
  const std::vector<Choice> choices = {{"abc", "stop", 3}, {"de", "length", 5}};
  json c = response_json(Endpoint::kCompletions, meta, choices, 4, nullptr);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["id"], "cmpl-1");
  EXPECT_EQ(c["created"], 1700000000);
  EXPECT_EQ(c["choices"][1]["text"], "de");
  EXPECT_EQ(c["choices"][1]["index"], 1);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(c["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(c["usage"], (json{{"prompt_tokens", 4}, {"completion_tokens", 8}, {"total_tokens", 12}}));
  EXPECT_FALSE(c.contains("diffusion"));
  json chat = response_json(Endpoint::kChatCompletions, meta, choices, 4, json{{"steps", 3}});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "abc"}}));
  EXPECT_EQ(chat["diffusion"]["steps"], 3);

  json k = chunk_json(Endpoint::kChatCompletions, meta, 0, "", true, "");
  EXPECT_EQ(k["object"], "chat.completion.chunk");
  EXPECT_EQ(k["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  k = chunk_json(Endpoint::kChatCompletions, meta, 2, "", false, "length");
  EXPECT_EQ(k["choices"][0]["delta"], json::object());
  EXPECT_EQ(k["choices"][0]["index"], 2);
  EXPECT_EQ(k["choices"][0]["finish_reason"], "length");
  k = chunk_json(Endpoint::kCompletions, meta, 0, "xy", false, "");
  EXPECT_EQ(k["object"], "text_completion");
  EXPECT_EQ(k["choices"][0]["text"], "xy");
  json u = usage_chunk_json(Endpoint::kChatCompletions, meta, 2, 3);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 5);
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event(json{{"a", 1}}, "canvas"), "event: canvas\ndata: {\"a\":1}\n\n");
}

TEST(OpenAiError, StatusMapping) {
  ApiError e = api_error(invalid_argument("temperature: must be in [0, 2]"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "temperature");
  json j = e.to_json();
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["message"], "temperature: must be in [0, 2]");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(api_error(invalid_argument("the prompt is empty: x")).param, "");  // not a field name
  EXPECT_EQ(api_error(not_found("x")).http_status, 404);
  EXPECT_EQ(api_error(internal_error("x")).http_status, 500);
  EXPECT_EQ(api_error(internal_error("x")).type, "server_error");
}

TEST(OpenAiStream, StopAndHoldBack) {
  EXPECT_EQ(find_stop("abc\n\ndef", {"\n\n"}), 3u);
  EXPECT_EQ(find_stop("abcdef", {"x", "cd", "b"}), 1u);
  EXPECT_EQ(find_stop("abc", {}), std::string::npos);
  EXPECT_EQ(streamable_prefix("hello", {}), 5u);
  EXPECT_EQ(streamable_prefix("hello wor", {"world"}), 6u);   // "wor" may begin the stop string
  EXPECT_EQ(streamable_prefix("hello\xEF\xBF\xBD", {}), 5u);  // a split byte-level token
  EXPECT_EQ(streamable_prefix("ab\xE4\xBD", {}), 2u);         // inside a 3-byte sequence
  EXPECT_EQ(streamable_prefix("ab\xE4\xBD\xA0", {}), 5u);     // complete
}

}  // namespace
}  // namespace dc::server

namespace dc::server {
namespace {

TEST(OpenAiParse, CacheModesAndTheFastMode) {
  const diffucoder::GenerationConfig defaults;
  auto dual = parse_request(Endpoint::kCompletions, R"({"prompt": "x", "cache": "dual", "block_length": 8})", defaults,
                            RequestLimits{});
  ASSERT_TRUE(dual.ok()) << dual.status().to_string();
  EXPECT_EQ(dual->config.cache, "dual");
  EXPECT_EQ(dual->config.block_length, 8);
  EXPECT_EQ(dual->config.threshold, 0.0f);

  RequestLimits fast;
  fast.fast = true;
  // serve --fast: a request that leaves the decoding fields alone gets Fast-dLLM's defaults...
  auto r = parse_request(Endpoint::kCompletions, R"({"prompt": "x"})", defaults, fast);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config.cache, "dual");
  EXPECT_EQ(r->config.block_length, 32);
  EXPECT_FLOAT_EQ(r->config.threshold, 0.9f);
  // ...and one that sets any of them decodes exactly as it asked.
  auto exact = parse_request(Endpoint::kCompletions, R"({"prompt": "x", "cache": "none"})", defaults, fast);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_EQ(exact->config.cache, "none");
  EXPECT_EQ(exact->config.block_length, 0);
  EXPECT_EQ(exact->config.threshold, 0.0f);

  auto committed = parse_request(Endpoint::kCompletions,
                                 R"({"prompt": "x", "cache": "committed", "refresh_every": 3, "block_length": 8})",
                                 defaults, RequestLimits{});
  ASSERT_TRUE(committed.ok()) << committed.status().to_string();
  EXPECT_EQ(committed->config.cache, "committed");
  EXPECT_EQ(committed->config.refresh_every, 3);
  for (const char* bad : {R"({"prompt": "x", "refresh_every": 0})", R"({"prompt": "x", "refresh_every": 1.5})",
                          R"({"prompt": "x", "refresh_every": "4"})"}) {
    auto refused = parse_request(Endpoint::kCompletions, bad, defaults, RequestLimits{});
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("refresh_every"), std::string::npos) << refused.status().message();
  }
}

}  // namespace
}  // namespace dc::server
