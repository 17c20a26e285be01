// Shared by the server tests: a real HttpServer on a free loopback port, run on its own thread, and raw
// socket helpers for what an HTTP client library would not send.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "api/model_impl.h"
#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "loopback.h"
#include "server/http.h"

namespace dc::server::test {

using namespace std::chrono_literals;
using dc::testing::connect_to;

// A server running on its own thread until stop() or destruction: over `model`, or over the facade's Model of
// an engine a test loaded (api::model_over: a view, kept as long as the server).
class Running {
 public:
  Running(const diffucoder::Model& model, ServerOptions options) : server_(model, std::move(options)) { start(); }
  Running(Engine& engine, ServerOptions options)
      : view_(api::model_over(engine)), server_(*view_, std::move(options)) {
    start();
  }
  ~Running() { stop(); }
  void stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return server_.port(); }
  const Metrics& metrics() const { return server_.metrics(); }

 private:
  void start() {
    const Status st = server_.bind();
    EXPECT_TRUE(st.ok()) << st.to_string();
    thread_ = std::thread([this] { server_.run(); });
    httplib::Client c("127.0.0.1", port());
    for (int i = 0; i < 200; ++i) {  // until it answers
      if (auto r = c.Get("/health"); r && r->status == 200) break;
      std::this_thread::sleep_for(10ms);
    }
  }

  std::unique_ptr<diffucoder::Model> view_;  // before server_: outlives it
  HttpServer server_;
  std::thread thread_;
};

// A suite whose tests share one engine on the tiny checkpoint with the real 152k vocabulary and the Qwen2
// tokenizer (`engine()`, and `model()`, the facade's Model over it), loaded once per suite.
class TinyVocabSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dc::testing::load_manifest();  // fails clearly when the fixtures are missing
    auto e = dc::testing::load_engine(dc::testing::fixtures_dir() + "/tiny-vocab", 2);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(*e).release();
    model_ = api::model_over(*engine_);
  }
  static void TearDownTestSuite() {
    model_.reset();
    delete engine_;
    engine_ = nullptr;
  }
  static Engine& engine() { return *engine_; }
  static const diffucoder::Model& model() { return *model_; }
  inline static Engine* engine_ = nullptr;
  inline static std::unique_ptr<diffucoder::Model> model_;
};


inline void send_all(int fd, const std::string& s) {
  ASSERT_EQ(send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

// Everything the server sends until it closes the connection (or the receive timeout).
inline std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

inline int64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

}  // namespace dc::server::test
