// Connection handling that slow or idle clients cannot exhaust. Between requests a connection waits in the
// ConnectionHub (one epoll thread, no worker): a new connection until its request head (and a small body)
// has arrived whole, a kept-alive one until its next request starts. Only a complete request goes to a
// worker, which reads the rest of its body under the same deadline (DeadlineStream). A streamed response
// (server-sent events) comes back to the hub too: the worker queues its request and hands the connection
// over, and the epoll thread writes the stream as the socket allows, from a bounded per-connection buffer
// (a reader that falls too far behind, or takes nothing for too long, is dropped). Connections are capped
// in total and per client address; a request head has one deadline for all of it, not one per read.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dc::server {

class Metrics;

struct ConnectionLimits {
  int max_connections = 1024;      // open connections in total (waiting and served); more get 503
  int max_per_client = 512;        // open connections from one client address; more get 503
  int request_timeout_s = 10;      // a request's head and body must arrive within this, from its first byte
  int keep_alive_timeout_s = 5;    // an idle kept-alive connection is closed after this
  size_t max_head_bytes = 16384;   // a larger request head gets 431
  int io_timeout_s = 10;           // a response's reader that takes no byte this long is dropped
  size_t max_stream_buffer_bytes = size_t{1} << 20;  // a stream's unsent bytes of earlier pulls (past the
                                                     // socket's buffers) at most; a reader further behind is
                                                     // dropped
  int send_buffer_bytes = 256 << 10;  // each connection's kernel send buffer (SO_SNDBUF; the kernel doubles it):
                                      // bounds the memory a client that stops reading pins (autotuning would
                                      // grow it to 4 MiB on loopback)
};

using SteadyTime = std::chrono::steady_clock::time_point;

// The socket of one request, for httplib's request parser: the head the hub saw is read up front; the body
// is read with no read past this request (a pipelined next request stays in the socket) and no read after
// `deadline`. Writes wait up to `write_timeout_s` each, and fail once the peer sent end-of-file (as httplib's
// own socket stream does); after discard_writes() they write nothing (the hub answers: a stream).
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(int fd, SteadyTime deadline, int write_timeout_s, size_t head_bytes);
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return fd_; }
  void discard_writes() { discard_ = true; }

 private:
  int fd_;
  SteadyTime deadline_;
  int write_timeout_s_;
  std::string head_;
  size_t at_ = 0;
  bool discard_ = false;
};

// The body of a streamed response; both functions run on the hub's thread (or in stop(), after it ended).
struct StreamBody {
  std::function<std::string(bool* done)> pull;  // the bytes that are new (may be none); *done: the response is whole
  std::function<void(bool complete)> closed;    // once: the body was written whole, or the client was dropped
};

class ConnectionHub {
 public:
  // serve(fd, deadline, head_bytes) runs on a worker (via `dispatch`) for each complete request head and
  // must end with release(fd, keep).
  using Serve = std::function<void(int fd, SteadyTime deadline, size_t head_bytes)>;
  using Dispatch = std::function<void(std::function<void()>)>;
  ConnectionHub(ConnectionLimits limits, Dispatch dispatch, Serve serve, Metrics* metrics);
  ~ConnectionHub();  // stop()
  ConnectionHub(const ConnectionHub&) = delete;
  ConnectionHub& operator=(const ConnectionHub&) = delete;

  // A connection from accept(): it waits for its request, or is answered 503 and closed over a cap.
  void accept(int fd);
  // After a served request: waits for the next one (keep-alive), or is closed.
  void release(int fd, bool keep);
  // After a worker queued a request whose answer is a stream: the hub writes what `body.pull` produces (the
  // response head, then its chunks) as the socket allows; once the body is done and written, the connection
  // waits for its next request (`keep`, and the client did not shut down its sending side) or is closed.
  // Returns the wake function: any thread (the engine thread's step callback) calls it when there is news;
  // it never blocks on the client. A reader whose unsent bytes of earlier pulls exceed max_stream_buffer_bytes
  // (the latest pull's bytes do not count), or that takes no byte for io_timeout_s, is dropped, as is a client
  // that went away: body.closed(false).
  std::function<void()> stream(int fd, StreamBody body, bool keep);
  // Closes every waiting connection; later accept() and release() close at once.
  void stop();

  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct Waiting {
    SteadyTime deadline;
    bool idle = false;  // kept alive, no byte of a next request yet
  };
  struct Streaming {
    int fd = -1;
    StreamBody body;
    bool keep = false;
    bool done = false;        // the whole response is in `out`
    bool wrote = false;       // a byte of it went out
    bool woken = false;       // in woken_
    std::string out;          // unsent bytes from `at`
    size_t at = 0;
    size_t fresh = 0;         // out[fresh, end) came with the latest pull that brought bytes
    SteadyTime progress;      // the last time bytes went out, or the buffer was empty
    SteadyTime pulled;        // the last pull
  };
  void run();
  void check(int fd);         // epoll thread: what arrived on a waiting connection
  // Epoll thread: pulls what is new into the buffer and writes what the socket takes; drops a reader too far
  // behind or gone; a finished stream goes back to waiting (keep-alive) or is closed.
  void pump(const std::shared_ptr<Streaming>& s, bool pull);
  void drop(const std::shared_ptr<Streaming>& s, bool complete, bool slow);
  void expire(SteadyTime now);  // epoll thread: closes waiting connections past their deadline
  void wake(const std::weak_ptr<Streaming>& s);  // any thread
  void wait_locked(int fd, SteadyTime deadline, bool idle);
  void close_locked(int fd);
  void answer_and_close(int fd, int status, const char* reason, const std::string& message, const char* type);

  const ConnectionLimits limits_;
  Dispatch dispatch_;
  Serve serve_;
  Metrics* metrics_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  std::mutex mu_;
  bool stopping_ = false;
  std::map<int, std::string> client_of_;   // every open connection → its client address
  std::map<std::string, int> per_client_;  // open connections per client address
  std::map<int, Waiting> waiting_;         // connections in the hub (not on a worker)
  std::map<int, std::shared_ptr<Streaming>> streams_;  // connections the hub writes a stream to
  std::vector<std::weak_ptr<Streaming>> woken_;         // streams with news (wake())
  std::string peek_;                       // epoll thread's read-ahead buffer
  std::thread thread_;
};

}  // namespace dc::server
