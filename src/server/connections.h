// Connection handling that slow or idle clients cannot exhaust. Between requests a connection waits in the
// ConnectionHub (one epoll thread, no worker): a new connection until its request head (and a small body)
// has arrived whole, a kept-alive one until its next request starts. Only a complete request goes to a
// worker, which reads the rest of its body under the same deadline (DeadlineStream). Connections are capped
// in total and per client address; a request head has one deadline for all of it, not one per read.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace dc::server {

class Metrics;

struct ConnectionLimits {
  int max_connections = 1024;      // open connections in total (waiting and served); more get 503
  int max_per_client = 512;        // open connections from one client address; more get 503
  int request_timeout_s = 10;      // a request's head and body must arrive within this, from its first byte
  int keep_alive_timeout_s = 5;    // an idle kept-alive connection is closed after this
  size_t max_head_bytes = 16384;   // a larger request head gets 431
};

using SteadyTime = std::chrono::steady_clock::time_point;

// The socket of one request, for httplib's request parser: the head the hub saw is read up front; the body
// is read with no read past this request (a pipelined next request stays in the socket) and no read after
// `deadline`. Writes wait up to `write_timeout_s` each, and fail once the peer sent end-of-file (as httplib's
// own socket stream does).
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

 private:
  int fd_;
  SteadyTime deadline_;
  int write_timeout_s_;
  std::string head_;
  size_t at_ = 0;
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
  // Closes every waiting connection; later accept() and release() close at once.
  void stop();

  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct Waiting {
    SteadyTime deadline;
    bool idle = false;  // kept alive, no byte of a next request yet
  };
  void run();
  void check(int fd);         // epoll thread: what arrived on a waiting connection
  void expire(SteadyTime now);  // epoll thread: closes waiting connections past their deadline
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
  std::string peek_;                       // epoll thread's read-ahead buffer
  std::thread thread_;
};

}  // namespace dc::server
