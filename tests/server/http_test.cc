// The real server on a free loopback port (in-process, tiny random checkpoint with the Qwen2 tokenizer),
// spoken to over HTTP: every endpoint, the OpenAI schemas, SSE streaming (text and canvas), stop strings,
// errors and limits (malformed JSON, wrong types, huge bodies, queue full), slow clients and disconnects.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "server/running_server.h"

namespace dc::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;


using test::connect_to;
using test::Running;
using test::send_all;

class HttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dc::testing::load_manifest();  // fails clearly when the fixtures are missing
    auto e = testing::load_engine(testing::vocab_model(), 2);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(*e).release();
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.max_body_bytes = 64 << 10;
    o.limits.max_tokens = 256;
    o.limits.max_prompt_tokens = 64;
    o.limits.max_n = 4;
    o.connections.io_timeout_s = 1;
    o.connections.request_timeout_s = 1;
    server_ = new Running(*engine_, o);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete engine_;
  }

  httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body) {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }

  static Engine* engine_;
  static Running* server_;
};

Engine* HttpTest::engine_ = nullptr;
Running* HttpTest::server_ = nullptr;

// The `data:` payloads (and event names) of an SSE body.
struct Sse {
  std::vector<std::string> events;  // "" for unnamed
  std::vector<std::string> data;
};
Sse parse_sse(const std::string& body) {
  Sse s;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    std::string event;
    std::string block = body.substr(at, end - at);
    at = end + 2;
    size_t p = 0;
    while (p < block.size()) {
      size_t nl = block.find('\n', p);
      if (nl == std::string::npos) nl = block.size();
      const std::string line = block.substr(p, nl - p);
      if (line.rfind("event: ", 0) == 0) event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) {
        s.events.push_back(event);
        s.data.push_back(line.substr(6));
      }
      p = nl + 1;
    }
  }
  return s;
}

int64_t metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return static_cast<int64_t>(std::stod(text.substr(at + name.size() + 2)));
}

TEST_F(HttpTest, HealthModelsMetricsAndPage) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  const json models = json::parse(m->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["object"], "model");
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("id=\"canvas\""), std::string::npos);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  ASSERT_TRUE(post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 4}}));
  auto mt = c.Get("/metrics");
  ASSERT_TRUE(mt);
  EXPECT_NE(mt->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  for (const char* name : {"dc_requests_total", "dc_queue_depth", "dc_tokens_per_second", "dc_step_seconds_count",
                           "dc_active_rows"})
    EXPECT_GE(metric(mt->body, name), 0) << name << " missing in\n" << mt->body;
  EXPECT_GT(metric(mt->body, "dc_step_seconds_count"), 0);
  EXPECT_GT(metric(mt->body, "dc_tokens_committed_total"), 0);
}

TEST_F(HttpTest, CompletionSchemaAndDeterminism) {
  const json body = {{"prompt", "def add(a, b):"}, {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 11}};
  auto r = post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_TRUE(j["choices"][0]["text"].is_string());
  EXPECT_TRUE(j["choices"][0]["finish_reason"] == "stop" || j["choices"][0]["finish_reason"] == "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], engine_->encode_prompt("def add(a, b):", false)->size());
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  // The same request alone and among concurrent others: the same text.
  std::vector<std::thread> others;
  for (int i = 0; i < 3; ++i)
    others.emplace_back([&, i] { post("/v1/completions", {{"prompt", std::string(i + 1, 'x')}, {"max_tokens", 20}}); });
  auto again = post("/v1/completions", body);
  for (auto& t : others) t.join();
  ASSERT_TRUE(again);
  EXPECT_EQ(json::parse(again->body)["choices"][0]["text"], j["choices"][0]["text"]);
}

TEST_F(HttpTest, ChatWithSeveralChoices) {
  auto r = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 6},
                                          {"n", 3}, {"temperature", 1.0}, {"seed", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["role"], "assistant");
    EXPECT_TRUE(j["choices"][i]["message"]["content"].is_string());
  }
}

TEST_F(HttpTest, StreamingMatchesNonStreaming) {
  const json body = {{"prompt", "int main() {"}, {"max_tokens", 16}, {"steps", 8}};
  auto full = post("/v1/completions", body);
  ASSERT_TRUE(full);
  const json want = json::parse(full->body);
  json sbody = body;
  sbody["stream"] = true;
  sbody["stream_options"] = {{"include_usage", true}};
  auto r = post("/v1/completions", sbody);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const Sse sse = parse_sse(r->body);
  ASSERT_GE(sse.data.size(), 3u);
  EXPECT_EQ(sse.data.back(), "[DONE]");
  std::string text, finish;
  json usage;
  for (size_t i = 0; i + 1 < sse.data.size(); ++i) {
    const json chunk = json::parse(sse.data[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    if (chunk.contains("usage")) {
      usage = chunk["usage"];
      EXPECT_TRUE(chunk["choices"].empty());
      continue;
    }
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, want["choices"][0]["text"]);
  EXPECT_EQ(finish, want["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage, want["usage"]);
}

TEST_F(HttpTest, ChatStreamWithCanvasEvents) {
  auto r = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 8},
                                          {"steps", 4}, {"stream", true}, {"stream_canvas", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const Sse sse = parse_sse(r->body);
  int canvases = 0;
  bool role_first = false;
  int last_masks = 9;
  for (size_t i = 0; i < sse.data.size(); ++i) {
    if (sse.events[i] == "canvas") {
      const json c = json::parse(sse.data[i]);
      ++canvases;
      EXPECT_EQ(c["step"], canvases);
      EXPECT_EQ(c["n_steps"], 4);
      ASSERT_EQ(c["rows"][0].size(), 8u);
      int masks = 0;
      for (const json& p : c["rows"][0]) masks += p.is_null() ? 1 : 0;
      EXPECT_LT(masks, last_masks);  // the canvas resolves step by step
      last_masks = masks;
    } else if (sse.data[i] != "[DONE]") {
      const json chunk = json::parse(sse.data[i]);
      EXPECT_EQ(chunk["object"], "chat.completion.chunk");
      if (i == 0) role_first = chunk["choices"][0]["delta"]["role"] == "assistant";
    }
  }
  EXPECT_TRUE(role_first);
  EXPECT_EQ(canvases, 4);
  EXPECT_EQ(last_masks, 0);
  EXPECT_EQ(sse.data.back(), "[DONE]");
}

// stream_canvas "changes": the first canvas event holds the rows, the later ones only [row, position, piece]
// changes; applied in order they give, at every step, the rows that stream_canvas true sends whole (the same
// deterministic generation), in fewer bytes.
TEST_F(HttpTest, CanvasChangesReassembleToTheWholeCanvasAtEveryStep) {
  const json base = {{"prompt", "def f(x):"}, {"max_tokens", 16}, {"steps", 8}, {"n", 2}, {"stream", true}};
  json whole_body = base, changes_body = base;
  whole_body["stream_canvas"] = true;
  changes_body["stream_canvas"] = "changes";
  auto whole = post("/v1/completions", whole_body);
  auto changes = post("/v1/completions", changes_body);
  ASSERT_TRUE(whole && changes);
  ASSERT_EQ(whole->status, 200) << whole->body;
  ASSERT_EQ(changes->status, 200) << changes->body;
  auto canvas_events = [](const std::string& body) {
    const Sse sse = parse_sse(body);
    std::vector<json> events;
    size_t bytes = 0;
    for (size_t i = 0; i < sse.data.size(); ++i)
      if (sse.events[i] == "canvas") events.push_back(json::parse(sse.data[i])), bytes += sse.data[i].size();
    return std::make_pair(events, bytes);
  };
  const auto [want, whole_bytes] = canvas_events(whole->body);
  const auto [got, changes_bytes] = canvas_events(changes->body);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size(), 8u);
  json rows;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i]["step"], want[i]["step"]);
    if (i == 0) {
      ASSERT_TRUE(got[i].contains("rows") && !got[i].contains("changes")) << got[i].dump();
      rows = got[i]["rows"];
    } else {
      ASSERT_TRUE(got[i].contains("changes") && !got[i].contains("rows")) << got[i].dump();
      EXPECT_FALSE(got[i]["changes"].empty()) << "step " << i;  // every step unmasks at least one position
      for (const json& c : got[i]["changes"]) rows[c[0].get<size_t>()][c[1].get<size_t>()] = c[2];
    }
    ASSERT_EQ(rows, want[i]["rows"]) << "step " << i;
  }
  for (const json& row : rows)
    for (const json& piece : row) EXPECT_FALSE(piece.is_null());  // resolved
  EXPECT_LT(changes_bytes, whole_bytes);
  // Anything else than true, false or "changes" is refused, naming the field.
  json bad = base;
  bad["stream_canvas"] = "all";
  auto refused = post("/v1/completions", bad);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(json::parse(refused->body)["error"]["param"], "stream_canvas") << refused->body;
}

TEST_F(HttpTest, StopStrings) {
  const json body = {{"prompt", "abc"}, {"max_tokens", 16}};
  const std::string text = json::parse(post("/v1/completions", body)->body)["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 2);
  json sbody = body;
  sbody["stop"] = {stop};
  const json j = json::parse(post("/v1/completions", sbody)->body);
  EXPECT_EQ(j["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  sbody["stream"] = true;
  const Sse sse = parse_sse(post("/v1/completions", sbody)->body);
  std::string streamed;
  for (const std::string& d : sse.data)
    if (d != "[DONE]") streamed += json::parse(d)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, text.substr(0, text.find(stop)));
}

TEST_F(HttpTest, ErrorsAndLimits) {
  auto c = client();
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400, "body"},
      {"/v1/completions", "[]", 400, "body"},
      {"/v1/completions", R"({"prompt": 5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 100000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "temperature": -2})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "x", "n": 50})", 400, "n"},
      {"/v1/completions", R"({"prompt": "x", "cache": "paged"})", 400, "cache"},
      {"/v1/completions", R"({"prompt": ""})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [999999999]})", 400, "prompt"},
      {"/v1/completions", json{{"prompt", std::string(2000, 'a') + " b c d e f g h i j k l m n o p q r s t u v w x y z "
                                                                  "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 "
                                                                  "21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36"}}
                              .dump(),
       400, "prompt"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400, "messages[0].content"},
  };
  for (const Case& k : cases) {
    auto r = c.Post(k.path.c_str(), k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.body << " → " << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], k.param) << k.body;
  }
  auto huge = c.Post("/v1/completions", std::string(200 << 10, ' '), "application/json");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->status, 413);
  EXPECT_TRUE(json::parse(huge->body).contains("error"));
  auto missing = c.Get("/v2/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["type"], "not_found_error");
  EXPECT_EQ(client().Get("/health")->status, 200);  // still alive
}

TEST_F(HttpTest, QueueFullIs503) {
  ServerOptions o;
  o.port = 0;
  o.scheduler.max_queue = 0;  // every request is refused
  Running refusing(*engine_, o);
  httplib::Client c("127.0.0.1", refusing.port());
  auto r = c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "server_overloaded");
}

std::string request(const std::string& body) {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Waits until the server saw `n` disconnects and no row is left in the batch.
bool wait_freed(const Metrics& m, int64_t disconnects) {
  for (int i = 0; i < 1000; ++i) {
    if (m.active_rows() == 0 && m.queue_depth() == 0 &&
        m.render().find("dc_client_disconnects_total " + std::to_string(disconnects)) != std::string::npos)
      return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST_F(HttpTest, DisconnectsFreeTheRows) {
  ServerOptions o;
  o.port = 0;
  Running own(*engine_, o);
  // Mid-stream: read the first bytes of a long stream, then hang up.
  int fd = connect_to(own.port());
  send_all(fd, request(R"({"prompt": "x", "max_tokens": 128, "stream": true})"));
  char buf[256];
  ASSERT_GT(recv(fd, buf, sizeof(buf), 0), 0);
  close(fd);
  EXPECT_TRUE(wait_freed(own.metrics(), 1)) << own.metrics().render();
  // Non-streaming: hang up while the generation runs.
  fd = connect_to(own.port());
  send_all(fd, request(R"({"prompt": "y", "max_tokens": 128})"));
  std::this_thread::sleep_for(300ms);
  close(fd);
  EXPECT_TRUE(wait_freed(own.metrics(), 2)) << own.metrics().render();
  httplib::Client c("127.0.0.1", own.port());
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST_F(HttpTest, SlowClientDoesNotBlockOthers) {
  // A client that sends half a request and stalls holds one connection (no worker) until the 1 s request
  // deadline; others are served meanwhile.
  const int fd = connect_to(server_->port());
  const std::string req = request(R"({"prompt": "x", "max_tokens": 2})");
  send_all(fd, req.substr(0, req.size() / 2));
  auto r = post("/v1/completions", {{"prompt", "z"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  std::this_thread::sleep_for(1500ms);
  char buf[512];
  const ssize_t n = recv(fd, buf, sizeof(buf), 0);  // the server gave up on it: EOF or an error response
  if (n > 0) {
    EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).find("200 OK"), std::string::npos);
  }
  close(fd);
}

}  // namespace
}  // namespace dc::server
