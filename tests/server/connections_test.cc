// Issue 20, connections: slow and idle clients cannot stall the server (they wait in the ConnectionHub, not on
// a worker), the request head has one deadline, connections are capped per client, keep-alive and pipelining
// go through the hub, a malformed head line is a 400, a stream nobody reads delays nobody else and holds no
// worker, and a stream's reader that falls too far behind (or takes nothing for --io-timeout) is dropped.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <utility>
#include <vector>

#include "server/connections.h"
#include "server/running_server.h"

namespace dc::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using test::connect_to;
using test::Running;
using test::send_all;

class Connections : public test::TinyVocabSuite {
 protected:
  static ServerOptions options() {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    return o;
  }
};

// True once the server closed `fd` (end-of-file or reset), waiting up to `wait`.
bool closed_by_server(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
  char buf[1024];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
  }
}

// The issue's attack: 300 connections that send a partial head and then one byte every 2 s, and 50 idle
// kept-alive connections. /health answers within 1 s every second and a completion succeeds meanwhile;
// memory stays flat; every slow socket is closed by the server at the request deadline. CI holds them for
// 5 s (deadline 7 s); DC_SLOW_HOLD_S=20 runs the issue's 20 s with the default 10 s deadline.
TEST_F(Connections, SlowAndIdleClientsDoNotStallTheServer) {
  const char* env = std::getenv("DC_SLOW_HOLD_S");
  const int hold_s = env != nullptr ? std::atoi(env) : 5;
  ServerOptions o = options();
  o.connections.request_timeout_s = std::min(10, hold_s + 2);
  o.connections.keep_alive_timeout_s = hold_s + 5;
  Running s(engine(), o);
  const int64_t rss_before = test::rss_bytes();
  std::vector<int> slow, idle;
  for (int i = 0; i < 300; ++i) {
    slow.push_back(connect_to(s.port(), 2));
    send_all(slow.back(), "GET /health HTTP/1.1\r\nHost: x\r\n");
  }
  for (int i = 0; i < 50; ++i) {
    idle.push_back(connect_to(s.port(), 2));
    send_all(idle.back(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    char buf[1024];
    ASSERT_GT(recv(idle.back(), buf, sizeof(buf), 0), 0);  // answered, and kept alive
  }
  std::atomic<bool> holding{true};
  std::thread trickle([&] {  // one byte every 2 s on every slow connection (errors once closed are fine)
    while (holding) {
      for (int fd : slow) (void)send(fd, "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      for (int k = 0; k < 20 && holding; ++k) std::this_thread::sleep_for(100ms);
    }
  });
  httplib::Client c("127.0.0.1", s.port());
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(1, 0);
  bool completed = false;
  for (int second = 0; second < hold_s; ++second) {
    const auto t0 = std::chrono::steady_clock::now();
    auto h = c.Get("/health");
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(h) << "second " << second << ": /health did not answer within 1 s";
    EXPECT_EQ(h->status, 200);
    EXPECT_LT(took, 1s) << "second " << second;
    if (!completed) {
      httplib::Client w("127.0.0.1", s.port());
      w.set_read_timeout(30, 0);
      auto r = w.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 8})", "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200) << r->body;
      completed = true;
    }
    std::this_thread::sleep_until(t0 + 1s);
  }
  holding = false;
  trickle.join();
  EXPECT_LT(test::rss_bytes() - rss_before, int64_t{64} << 20);
  // The deadline is for the whole head: bytes every 2 s do not extend it.
  int closed = 0;
  for (int fd : slow) closed += closed_by_server(fd, std::chrono::seconds(o.connections.request_timeout_s + 2)) ? 1 : 0;
  EXPECT_EQ(closed, 300) << "slow connections the server closed";
  for (int fd : slow) close(fd);
  for (int fd : idle) close(fd);
}

TEST_F(Connections, PerClientCapAnswers503) {
  ServerOptions o = options();
  o.connections.max_per_client = 4;
  Running s(engine(), o);
  for (int i = 0; i < 200 && s.metrics().connections_open() > 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(s.metrics().connections_open(), 0) << "the start-up probe's connection is still open";
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_to(s.port(), 5));
  for (int i = 0; i < 200 && s.metrics().connections_open() < 4; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(s.metrics().connections_open(), 4);  // accepted and counted
  const int extra = connect_to(s.port(), 5);
  const std::string answer = test::read_all(extra);
  close(extra);
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_NE(answer.find("--max-connections-per-client"), std::string::npos) << answer;
  for (int fd : held) close(fd);
  std::this_thread::sleep_for(200ms);  // the hub sees them go
  httplib::Client c("127.0.0.1", s.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// Issue 23 item 17: a header line without a colon is a 400 (it was accepted).
TEST_F(Connections, HeaderLineWithoutColonIs400) {
  Running s(engine(), options());
  for (const char* head : {"GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n",
                           "GET /health HTTP/1.1\r\nHost: x\r\n: empty name\r\n\r\n",
                           "GET /health\r\nHost: x\r\n\r\n"}) {
    const int fd = connect_to(s.port(), 5);
    send_all(fd, head);
    const std::string answer = test::read_all(fd);
    close(fd);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << head << "\n→ " << answer;
    EXPECT_NE(answer.find("\"invalid_request_error\""), std::string::npos) << answer;
  }
}

// Keep-alive and pipelining through the hub: two requests sent at once on one connection get two answers,
// and a third after a pause is answered on the same connection.
TEST_F(Connections, KeepAliveAndPipelining) {
  Running s(engine(), options());
  const int fd = connect_to(s.port(), 10);
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n" + body;
  send_all(fd, post + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string got;
  char buf[4096];
  while (got.find("\"status\":\"ok\"") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_NE(got.find("\"choices\""), std::string::npos) << got;
  std::this_thread::sleep_for(300ms);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string third = test::read_all(fd);
  close(fd);
  EXPECT_EQ(third.rfind("HTTP/1.1 200", 0), 0u) << third;
}

// A streaming client that stops reading holds no worker: another client's completion finishes while that
// stream is stuck.
TEST_F(Connections, StalledStreamReaderDoesNotDelayOthers) {
  ServerOptions o = options();
  o.connections.io_timeout_s = 30;  // the stuck stream stays stuck for the whole test
  o.connections.max_stream_buffer_bytes = size_t{16} << 20;  // and is not dropped for being behind
  Running s(engine(), o);
  const int stuck = connect_to(s.port(), 5);
  // ~500 canvas events of ~3 KB: more than the socket buffers (the server's 512 KiB, the client's ~128 KiB) hold,
  // in cheap steps (blocks of 8 positions).
  const std::string body =
      R"({"prompt": "x", "max_tokens": 512, "steps": 512, "block_length": 8, "stream": true, "stream_canvas": true})";
  send_all(stuck, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body);
  std::this_thread::sleep_for(1s);  // its canvas events fill both socket buffers: the rest waits in the hub
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(10, 0);
  for (int i = 0; i < 3; ++i) {
    auto r = c.Post("/v1/completions", R"({"prompt": "y", "max_tokens": 16})", "application/json");
    ASSERT_TRUE(r) << "completion " << i << " did not finish within 10 s";
    EXPECT_EQ(r->status, 200) << r->body;
  }
  // The stuck reader still gets its whole stream once it reads: more than the socket buffers could hold,
  // so it waited in the hub's buffer while it did not read.
  const std::string rest = test::read_all(stuck);
  close(stuck);
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos) << rest.substr(rest.size() > 500 ? rest.size() - 500 : 0);
  EXPECT_GT(rest.size(), size_t{1} << 20);
}

// A stream request on a raw socket (the client reads only when the test says so).
int open_stream(int port, const std::string& body, bool close_after, int receive_buffer_bytes = 0) {
  const int fd = connect_to(port, 10, receive_buffer_bytes);
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + std::string(close_after ? "Connection: close\r\n" : "") +
                   "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                   body);
  return fd;
}

// True once `done()` holds, polling for up to `wait`.
template <typename F>
bool eventually(F done, std::chrono::milliseconds wait) {
  for (const auto end = std::chrono::steady_clock::now() + wait; std::chrono::steady_clock::now() < end;
       std::this_thread::sleep_for(10ms))
    if (done()) return true;
  return done();
}

// More streams than workers: 12 streams whose clients read nothing, on 4 workers. Every one is admitted
// (a worker only parses and queues it; the hub writes it), and /health and a completion answer at once while
// they run. Then 4 more streams wait in the queue (the batch is full): they hold no worker either. Before the
// hub wrote streams, 4 of them held the 4 workers for their whole life.
TEST_F(Connections, StreamsHoldNoWorker) {
  ServerOptions o = options();
  o.http_threads = 4;
  o.connections.io_timeout_s = 30;
  o.scheduler.max_batch_rows = 13;  // the 12 streams and the completion
  Running s(engine(), o);
  std::vector<int> streams;
  auto open_long_stream = [&](int i) {
    streams.push_back(open_stream(
        s.port(), R"({"prompt": "s)" + std::to_string(i) + R"(", "max_tokens": 256, "block_length": 8, "stream": true})",
        true));
  };
  for (int i = 0; i < 12; ++i) open_long_stream(i);
  ASSERT_TRUE(eventually([&] { return s.metrics().active_rows() >= 12; }, 10s))
      << "streams being decoded: " << s.metrics().active_rows();
  httplib::Client c("127.0.0.1", s.port());
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(30, 0);  // (it shares each step with the 12 streams; under the sanitizers too)
  auto t0 = std::chrono::steady_clock::now();
  auto h = c.Get("/health");
  ASSERT_TRUE(h) << "/health did not answer while 12 streams ran on 4 workers";
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  auto r = c.Post("/v1/completions", R"({"prompt": "y", "max_tokens": 8})", "application/json");
  ASSERT_TRUE(r) << "a completion did not finish within 30 s while 12 streams ran on 4 workers";
  EXPECT_EQ(r->status, 200) << r->body;
  for (int i = 12; i < 16; ++i) open_long_stream(i);
  ASSERT_TRUE(eventually([&] { return s.metrics().queue_depth() == 4; }, 10s))
      << "streams queued: " << s.metrics().queue_depth();
  t0 = std::chrono::steady_clock::now();
  h = c.Get("/health");
  ASSERT_TRUE(h) << "/health did not answer while 4 streams waited in the queue on 4 workers";
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_GE(s.metrics().active_rows(), 12) << "the streams ended before the checks: make them longer";
  for (int fd : streams) close(fd);  // hanging up cancels their jobs, queued or running
  EXPECT_TRUE(eventually([&] { return s.metrics().active_rows() == 0 && s.metrics().queue_depth() == 0; }, 10s))
      << s.metrics().render();
  EXPECT_EQ(s.metrics().slow_readers(), 0);
}

constexpr int kSmallSocketBufferBytes = 4 << 10;  // both ends' buffers in the unread-stream tests

// Opens a stream of canvas events of ~3 KB that is never read, and expects the server to drop it as a slow
// reader and cancel its job. Returns its socket. The server's options must give the stream's socket a small
// send buffer (small_socket_buffers): with the client's receive buffer as small, ~20 events fill both. (With
// the default buffers ~250 events did, which took 54-72 s to decode under ASan.)
int expect_unread_stream_dropped(Running& s) {
  const int fd = open_stream(
      s.port(), R"({"prompt": "x", "max_tokens": 512, "steps": 512, "block_length": 8, "stream": true, "stream_canvas": true})",
      false, kSmallSocketBufferBytes);
  EXPECT_TRUE(eventually([&] { return s.metrics().slow_readers() == 1; }, 180s)) << s.metrics().render();
  EXPECT_TRUE(eventually([&] { return s.metrics().active_rows() == 0; }, 10s)) << "its job was not cancelled";
  return fd;
}

ServerOptions small_socket_buffers(ServerOptions o) {
  o.connections.send_buffer_bytes = kSmallSocketBufferBytes;
  return o;
}

// A reader further behind than --max-stream-buffer is dropped and its job cancelled; the server goes on.
TEST_F(Connections, StreamReaderTooFarBehindIsDropped) {
  ServerOptions o = small_socket_buffers(options());
  o.connections.io_timeout_s = 30;
  o.connections.max_stream_buffer_bytes = 64 << 10;
  Running s(engine(), o);
  const int fd = expect_unread_stream_dropped(s);
  EXPECT_NE(s.metrics().render().find("dc_client_disconnects_total 1"), std::string::npos);
  const std::string got = test::read_all(fd);  // what the socket buffers held, then the end
  close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK", 0), 0u);
  EXPECT_EQ(got.find("data: [DONE]"), std::string::npos);
  httplib::Client c("127.0.0.1", s.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// The review's finding: the bytes a pull just brought counted as "behind" before the reader could take them,
// so one step's events larger than --max-stream-buffer (past the socket's buffers) dropped a reader that
// reads as fast as it can. Here one pull of 4 MiB against a 4 KiB limit reaches a reader that keeps up, whole.
TEST(StreamBuffer, OnePullLargerThanTheLimitReachesAReaderThatKeepsUp) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ConnectionLimits limits;
  limits.max_stream_buffer_bytes = 4096;
  ConnectionHub hub(limits, [](std::function<void()> f) { f(); }, [](int, SteadyTime, size_t) {}, nullptr);
  const std::string payload(size_t{4} << 20, 'x');
  std::promise<bool> closed;
  bool pulled = false;
  hub.stream(sv[0],
             StreamBody{[&](bool* done) {
                          *done = true;
                          return std::exchange(pulled, true) ? std::string() : payload;
                        },
                        [&](bool complete) { closed.set_value(complete); }},
             false);
  std::string got;
  char buf[1 << 16];
  for (ssize_t n; (n = recv(sv[1], buf, sizeof(buf), 0)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(sv[1]);
  auto complete = closed.get_future();
  ASSERT_EQ(complete.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(complete.get()) << "the reader was dropped as slow";
  EXPECT_EQ(got.size(), payload.size());
}

// A reader that takes no byte for --io-timeout is dropped too, however large the buffer.
TEST_F(Connections, StalledStreamReaderIsDroppedAtTheDeadline) {
  ServerOptions o = small_socket_buffers(options());
  o.connections.io_timeout_s = 1;
  o.connections.max_stream_buffer_bytes = size_t{64} << 20;
  Running s(engine(), o);
  close(expect_unread_stream_dropped(s));
}

// A stream waits in the queue in the hub; one that waits too long gets the same 503 as a completion would,
// as a plain response (no stream was started).
TEST_F(Connections, QueuedStreamTimesOutWith503) {
  ServerOptions o = options();
  o.scheduler.max_batch_rows = 1;
  o.scheduler.max_queue_seconds = 0.3;
  Running s(engine(), o);
  const int running = open_stream(s.port(), R"({"prompt": "x", "max_tokens": 1024, "block_length": 8, "stream": true})", true);
  ASSERT_TRUE(eventually([&] { return s.metrics().active_rows() == 1; }, 10s));
  const int queued = open_stream(s.port(), R"({"prompt": "y", "max_tokens": 4, "stream": true})", true);
  const std::string got = test::read_all(queued);
  close(queued);
  close(running);
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("\"server_overloaded\""), std::string::npos) << got;
  EXPECT_NE(s.metrics().render().find("dc_responses_total{class=\"5xx\"} 1"), std::string::npos) << s.metrics().render();
}

// After a stream ends, its connection is kept alive (the client did not ask to close): the next request on it
// is answered.
TEST_F(Connections, ConnectionIsKeptAliveAfterAStream) {
  Running s(engine(), options());
  const int fd = open_stream(s.port(), R"({"prompt": "x", "max_tokens": 4, "stream": true})", false);
  std::string got;
  char buf[4096];
  while (got.find("0\r\n\r\n") == std::string::npos) {  // the chunked body's end
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos) << got;
  EXPECT_EQ(got.find("Connection: close"), std::string::npos) << got;
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string next = test::read_all(fd);
  close(fd);
  EXPECT_EQ(next.rfind("HTTP/1.1 200", 0), 0u) << next;
}

}  // namespace
}  // namespace dc::server
