// Issue 20, API keys: loading (--api-key, --api-key-file), the Bearer check, and the server with keys:
// /v1/* and /metrics need one (401 in OpenAI's error schema otherwise), /health stays open, the page asks
// for it, --metrics-open and --no-web-page; without keys nothing changes.
#include "server/auth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server/running_server.h"
#include "temp_dir.h"

namespace dc::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::Running;

fs::path write_file(const dc::test::TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir.file(name);
  std::ofstream(p) << text;
  return p;
}

TEST(ApiKeys, LoadsKeysFromFlagsAndFile) {
  const dc::test::TempDir tmp("keys");
  const fs::path file = write_file(tmp, "keys", "# team keys\n\n  sk-file-one  \nsk-file-two\n");
  Result<ApiKeys> keys = ApiKeys::load({"sk-flag"}, file.string());
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  EXPECT_EQ(keys->size(), 3u);
  EXPECT_TRUE(keys->accepts("Bearer sk-flag"));
  EXPECT_TRUE(keys->accepts("Bearer sk-file-one"));
  EXPECT_TRUE(keys->accepts("Bearer sk-file-two"));
  for (const char* bad : {"", "Bearer", "Bearer ", "bearer \t ", "sk-flag", "Basic sk-flag", "Bearersk-flag",
                          "Bearer-sk-flag", "Bearer sk-fla", "Bearer sk-flagg", "Bearer # team keys",
                          "Bearer sk-file-one sk-file-two", "Bear sk-flag", "bearer sk-wrong"})
    EXPECT_FALSE(keys->accepts(bad)) << bad;
}

// Issue 41, probe finding 12: the scheme is case-insensitive (RFC 7235 §2.1), and spaces or tabs may
// separate it from the key.
TEST(ApiKeys, SchemeIsCaseInsensitiveAndSpacesMayRepeat) {
  Result<ApiKeys> keys = ApiKeys::load({"sk-one"}, "");
  ASSERT_TRUE(keys.ok()) << keys.status().to_string();
  for (const char* good : {"Bearer sk-one", "bearer sk-one", "BEARER sk-one", "bEaReR sk-one", "Bearer   sk-one",
                           "bearer\tsk-one", "Bearer \t sk-one", "Bearer sk-one  "})
    EXPECT_TRUE(keys->accepts(good)) << good;
  EXPECT_EQ(bearer_token("bearer  \tsk-x").value_or("(none)"), "sk-x");
  EXPECT_FALSE(bearer_token("Basic sk-one"));
  EXPECT_FALSE(bearer_token("bearer"));
  // A lower-case scheme with a wrong key is still refused, as an incorrect key (not a malformed header).
  const std::optional<ApiError> wrong = keys->refuse("bearer sk-two");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->http_status, 401);
  EXPECT_EQ(wrong->message, "Incorrect API key provided.");
  EXPECT_NE(keys->refuse("Basic sk-one")->message.find("expected 'Bearer"), std::string::npos);
  EXPECT_FALSE(keys->refuse("bearer sk-one"));
}

TEST(ApiKeys, BadKeysAndFilesAreNamedNotEchoed) {
  const dc::test::TempDir tmp("keys");
  const fs::path empty = write_file(tmp, "empty", "# nothing\n\n");
  const fs::path spaced = write_file(tmp, "spaced", "good\nsecret with space\n");
  struct Case {
    std::vector<std::string> keys;
    std::string file, want;
  } cases[] = {
      {{""}, "", "--api-key: the API key is empty"},
      {{"a\tb"}, "", "--api-key: the API key has a space"},
      {{}, empty.string(), "no key in it"},
      {{}, spaced.string(), "line 2"},
      {{}, "/nonexistent/keys", "no such file"},
      {{}, "/tmp", "not a regular file"},
  };
  for (const Case& c : cases) {
    Result<ApiKeys> keys = ApiKeys::load(c.keys, c.file);
    ASSERT_FALSE(keys.ok()) << c.want;
    EXPECT_NE(keys.status().message().find(c.want), std::string::npos) << keys.status().message();
    EXPECT_EQ(keys.status().message().find("secret"), std::string::npos) << keys.status().message();
  }
}

class AuthServer : public test::TinyVocabSuite {
 protected:
  static ServerOptions options(std::vector<std::string> keys) {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.api_keys = *ApiKeys::load(keys, "");
    return o;
  }
};

httplib::Headers bearer(const std::string& value) { return {{"Authorization", value}}; }

TEST_F(AuthServer, EveryV1RouteNeedsAKey) {
  Running s(engine(), options({"sk-one", "sk-two"}));
  httplib::Client c("127.0.0.1", s.port());
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})";
  for (const char* header : {"", "Bearer sk-wrong", "Bearer", "Basic sk-one", "sk-one", "Bearer sk-one2"}) {
    const httplib::Headers h = *header ? bearer(header) : httplib::Headers{};
    std::vector<httplib::Result> answers;
    answers.push_back(c.Get("/v1/models", h));
    answers.push_back(c.Post("/v1/completions", h, body, "application/json"));
    answers.push_back(c.Post("/v1/chat/completions", h, chat, "application/json"));
    answers.push_back(c.Get("/metrics", h));
    answers.push_back(c.Get("/v1/nonexistent", h));
    for (const httplib::Result& r : answers) {
      ASSERT_TRUE(r) << header;
      EXPECT_EQ(r->status, 401) << header << " → " << r->body;
      EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
      const json e = json::parse(r->body).at("error");
      EXPECT_EQ(e["type"], "invalid_request_error") << r->body;
      EXPECT_EQ(e["code"], "invalid_api_key") << r->body;
      EXPECT_TRUE(e["param"].is_null()) << r->body;
      EXPECT_EQ(r->body.find("sk-"), std::string::npos) << "a key echoed: " << r->body;
    }
  }
  for (const char* key : {"Bearer sk-one", "Bearer sk-two"}) {
    auto r = c.Post("/v1/completions", bearer(key), body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(c.Get("/v1/models", bearer(key))->status, 200);
    EXPECT_EQ(c.Get("/metrics", bearer(key))->status, 200);
  }
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("data-needs-key=\"1\""), std::string::npos);
  auto metrics = c.Get("/metrics", bearer("Bearer sk-one"));
  EXPECT_NE(metrics->body.find("dc_unauthorized_total 30"), std::string::npos) << metrics->body;
}

// Issue 41, probe finding 12, over HTTP: every case of the scheme (and tabs or several spaces after it) is
// accepted on /v1/* and /metrics; a wrong key in any case is still 401.
TEST_F(AuthServer, SchemeInAnyCaseIsAccepted) {
  Running s(engine(), options({"sk-one"}));
  httplib::Client c("127.0.0.1", s.port());
  for (const char* header : {"Bearer sk-one", "bearer sk-one", "BEARER sk-one", "BeArEr sk-one",
                             "bearer    sk-one", "Bearer\tsk-one", "bearer \t sk-one"}) {
    auto models = c.Get("/v1/models", bearer(header));
    ASSERT_TRUE(models) << header;
    EXPECT_EQ(models->status, 200) << header << " → " << models->body;
    auto metrics = c.Get("/metrics", bearer(header));
    ASSERT_TRUE(metrics) << header;
    EXPECT_EQ(metrics->status, 200) << header;
  }
  for (const char* header : {"bearer sk-two", "BEARER sk-on", "bearer", "bearersk-one", "basic sk-one"}) {
    auto r = c.Get("/v1/models", bearer(header));
    ASSERT_TRUE(r) << header;
    EXPECT_EQ(r->status, 401) << header << " → " << r->body;
  }
}

TEST_F(AuthServer, SwitchesForMetricsAndPage) {
  ServerOptions o = options({"sk-one"});
  o.metrics_open = true;
  o.web_page = false;
  Running s(engine(), o);
  httplib::Client c("127.0.0.1", s.port());
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  EXPECT_EQ(c.Get("/")->status, 404);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
}

TEST_F(AuthServer, WithoutKeysNothingIsAsked) {
  Running s(engine(), options({}));
  httplib::Client c("127.0.0.1", s.port());
  EXPECT_EQ(c.Get("/v1/models")->status, 200);
  EXPECT_EQ(c.Get("/v1/models", bearer("Bearer anything"))->status, 200);
  EXPECT_EQ(c.Get("/metrics")->status, 200);
  auto page = c.Get("/");
  EXPECT_NE(page->body.find("data-needs-key=\"0\""), std::string::npos);
}

}  // namespace
}  // namespace dc::server
