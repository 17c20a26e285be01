// ConnectionHub: an epoll thread that holds connections between requests (peeking, never reading, until a
// request head is complete, so that httplib's parser sees every byte) and writes streamed responses, and
// DeadlineStream, the socket of one request for httplib's parser.
#include "server/connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "server/metrics.h"
#include "server/openai.h"

namespace dc::server {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr size_t kPeekBody = size_t{64} << 10;  // body bytes awaited in the hub; the rest is read under the deadline
constexpr auto kPullEvery = 250ms;               // a stream is also pulled this often without news (keep-alives)

std::string address_of(const sockaddr_storage& a, int* port) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, buf, sizeof(buf));
    if (port != nullptr) *port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof(buf));
    if (port != nullptr) *port = ntohs(in6.sin6_port);
  }
  return buf;
}

std::string peer_address(int fd, int* port = nullptr) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  return address_of(a, port);
}

bool iequals_prefix(std::string_view line, std::string_view name) {
  if (line.size() < name.size()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(line[i])) != std::tolower(static_cast<unsigned char>(name[i])))
      return false;
  return true;
}

// What the hub needs from a complete head (without its final blank line): why it is malformed, or how many
// body bytes to await before a worker takes it.
struct HeadCheck {
  std::optional<std::string> error;
  size_t await_body = 0;
};

HeadCheck check_head(std::string_view head) {
  HeadCheck r;
  size_t at = head.find("\r\n");
  const std::string_view request_line = head.substr(0, at);
  if (request_line.empty() || std::count(request_line.begin(), request_line.end(), ' ') != 2 ||
      request_line.find("HTTP/1.") == std::string_view::npos) {
    r.error = "request line: expected 'METHOD target HTTP/1.x'";
    return r;
  }
  bool waits_for_continue = false, chunked = false;
  std::optional<size_t> length;
  for (at = at == std::string_view::npos ? head.size() : at + 2; at < head.size();) {
    size_t end = head.find("\r\n", at);
    if (end == std::string_view::npos) end = head.size();
    const std::string_view line = head.substr(at, end - at);
    at = end + 2;
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    if (colon == std::string_view::npos || name.empty() ||
        name.find_first_of(" \t\r\n") != std::string_view::npos) {
      r.error = "header line without a 'name: value' form: '" + std::string(line.substr(0, 60)) + "'";
      return r;
    }
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    if (iequals_prefix(name, "Content-Length") && name.size() == 14) {
      // A malformed or repeated length goes to the worker, whose framing check names it.
      if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string_view::npos ||
          length) {
        r.await_body = 0;
        return r;
      }
      length = std::stoull(std::string(value));
    } else if (iequals_prefix(name, "Expect") && name.size() == 6) {
      waits_for_continue = true;  // the client sends its body after the worker's 100 Continue
    } else if (iequals_prefix(name, "Transfer-Encoding") && name.size() == 17) {
      chunked = true;
    }
  }
  r.await_body = waits_for_continue || chunked || !length ? 0 : std::min(*length, kPeekBody);
  return r;
}

// Where the head's lines do not end in CRLF: the offset of the first bare LF, or of a CR followed by anything
// but LF (a CR at the very end may still get its LF). RFC 9112 §2.2 lets a server refuse these; without
// the refusal such a head never shows its end ("\r\n\r\n") and would wait for the request deadline.
std::optional<size_t> bare_line_end(std::string_view head) {
  for (size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) return i;
    if (head[i] == '\r' && i + 1 < head.size() && head[i + 1] != '\n') return i;
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// DeadlineStream

DeadlineStream::DeadlineStream(int fd, SteadyTime deadline, int write_timeout_s, size_t head_bytes)
    : fd_(fd), deadline_(deadline), write_timeout_s_(write_timeout_s) {
  head_.resize(head_bytes);
  size_t got = 0;
  while (got < head_bytes) {  // already in the socket (the hub saw it), so this does not wait
    const ssize_t n = recv(fd_, head_.data() + got, head_bytes - got, MSG_DONTWAIT);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  head_.resize(got);
}

bool DeadlineStream::is_readable() const {
  if (at_ < head_.size()) return true;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
  if (left <= 0) return false;
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30))) > 0;
}

ssize_t DeadlineStream::read(char* ptr, size_t size) {
  if (at_ < head_.size()) {
    const size_t n = std::min(size, head_.size() - at_);
    std::memcpy(ptr, head_.data() + at_, n);
    at_ += n;
    return static_cast<ssize_t>(n);
  }
  if (!is_readable()) return -1;
  return recv(fd_, ptr, size, 0);
}

bool DeadlineStream::is_writable() const {
  pollfd w{fd_, POLLOUT, 0};
  if (poll(&w, 1, write_timeout_s_ * 1000) <= 0) return false;
  char c;  // a peer that sent end-of-file counts as gone (httplib's rule; PeerWatch answers half-closed ones)
  return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
}

ssize_t DeadlineStream::write(const char* ptr, size_t size) {
  if (discard_) return static_cast<ssize_t>(size);
  if (!is_writable()) return -1;
  return send(fd_, ptr, size, MSG_NOSIGNAL);
}

void DeadlineStream::get_remote_ip_and_port(std::string& ip, int& port) const { ip = peer_address(fd_, &port); }

void DeadlineStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  port = 0;
  ip = getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? address_of(a, &port) : "";
}

// ---------------------------------------------------------------------------------------------------
// ConnectionHub

ConnectionHub::ConnectionHub(ConnectionLimits limits, Dispatch dispatch, Serve serve, Metrics* metrics)
    : limits_(limits), dispatch_(std::move(dispatch)), serve_(std::move(serve)), metrics_(metrics) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { run(); });
}

ConnectionHub::~ConnectionHub() {
  stop();
  close(epoll_fd_);
  close(wake_fd_);
}

void ConnectionHub::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<Streaming>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!waiting_.empty()) close_locked(waiting_.begin()->first);
    for (const auto& [fd, st] : streams_) streams.push_back(st);
  }
  for (const auto& st : streams) drop(st, false, false);
}

void ConnectionHub::accept(int fd) {
  const std::string client = peer_address(fd);
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) {
    close(fd);
    return;
  }
  const int total = static_cast<int>(client_of_.size());
  const int mine = per_client_.count(client) ? per_client_[client] : 0;
  if (total >= limits_.max_connections || mine >= limits_.max_per_client) {
    lock.unlock();
    const std::string message =
        total >= limits_.max_connections
            ? "too many open connections (the server's limit is " + std::to_string(limits_.max_connections) +
                  ", --max-connections); retry later"
            : "too many open connections from your address (the limit is " + std::to_string(limits_.max_per_client) +
                  ", --max-connections-per-client); close idle ones or retry later";
    if (metrics_ != nullptr) metrics_->on_connection_refused();
    answer_and_close(fd, 503, "Service Unavailable", message, "server_error");
    return;
  }
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &limits_.send_buffer_bytes, sizeof(limits_.send_buffer_bytes));
  client_of_[fd] = client;
  ++per_client_[client];
  if (metrics_ != nullptr) metrics_->set_connections_open(static_cast<int64_t>(client_of_.size()));
  wait_locked(fd, Clock::now() + std::chrono::seconds(limits_.request_timeout_s), false);
}

void ConnectionHub::release(int fd, bool keep) {
  std::lock_guard<std::mutex> lock(mu_);
  if (keep && !stopping_) {
    wait_locked(fd, Clock::now() + std::chrono::seconds(limits_.keep_alive_timeout_s), true);
  } else {
    close_locked(fd);
  }
}

void ConnectionHub::wait_locked(int fd, SteadyTime deadline, bool idle) {
  waiting_[fd] = Waiting{deadline, idle};
  epoll_event ev{};
  // Edge-triggered: peeking leaves the bytes in the socket, so a level-triggered wait would wake at once.
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) close_locked(fd);
}

void ConnectionHub::close_locked(int fd) {
  if (waiting_.erase(fd) > 0 || streams_.erase(fd) > 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  auto it = client_of_.find(fd);
  if (it != client_of_.end()) {
    if (--per_client_[it->second] <= 0) per_client_.erase(it->second);
    client_of_.erase(it);
  }
  if (metrics_ != nullptr) metrics_->set_connections_open(static_cast<int64_t>(client_of_.size()));
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

void ConnectionHub::answer_and_close(int fd, int status, const char* reason, const std::string& message,
                                     const char* type) {
  ApiError e;
  e.http_status = status;
  e.type = type;
  e.message = message;
  const std::string body = e.to_json().dump();
  const std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                          "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\nConnection: close\r\n\r\n" + body;
  (void)send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  char sink[4096];  // what the client sent, read, so that closing does not reset the answer away
  while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
  shutdown(fd, SHUT_WR);
  std::lock_guard<std::mutex> lock(mu_);
  if (client_of_.count(fd)) {
    close_locked(fd);
  } else {
    close(fd);
  }
}

void ConnectionHub::run() {
  std::vector<epoll_event> events(256);
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 100);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    for (int i = 0; i < n; ++i) {
      const epoll_event& ev = events[static_cast<size_t>(i)];
      if (ev.data.fd == wake_fd_) {
        uint64_t count;
        (void)::read(wake_fd_, &count, sizeof(count));
        continue;
      }
      std::shared_ptr<Streaming> st;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = streams_.find(ev.data.fd); it != streams_.end()) st = it->second;
      }
      if (st == nullptr) {
        check(ev.data.fd);
      } else if (ev.events & (EPOLLERR | EPOLLHUP)) {
        drop(st, false, false);
      } else {
        if (ev.events & EPOLLRDHUP) {  // it may still read (shutdown(SHUT_WR)): close at the end
          st->keep = false;
          // Before any byte of the answer (the job waits in the queue), an interim response probes it: a peer
          // that closed answers with a reset (EPOLLERR), one that only shut down its sending side reads on.
          if (!st->wrote && st->out.empty()) st->out = "HTTP/1.1 102 Processing\r\n\r\n";
        }
        pump(st, false);
      }
    }
    std::vector<std::weak_ptr<Streaming>> woken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken.swap(woken_);
      for (const auto& w : woken)
        if (auto st = w.lock()) st->woken = false;
    }
    for (const auto& w : woken)
      if (auto st = w.lock()) pump(st, true);
    expire(Clock::now());
  }
}

std::function<void()> ConnectionHub::stream(int fd, StreamBody body, bool keep) {
  auto st = std::make_shared<Streaming>();
  st->fd = fd;
  st->keep = keep;
  st->progress = st->pulled = Clock::now();
  bool taken = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLRDHUP | EPOLLET;  // edge-triggered: written until EAGAIN, then the next edge
    ev.data.fd = fd;
    if (stopping_ || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close_locked(fd);
    } else {
      st->body = std::move(body);
      streams_[fd] = st;
      st->woken = true;  // what is already there goes out
      woken_.push_back(st);
      taken = true;
    }
  }
  if (!taken) {
    body.closed(false);
    return [] {};
  }
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof(one));
  return [this, w = std::weak_ptr<Streaming>(st)] { wake(w); };
}

void ConnectionHub::wake(const std::weak_ptr<Streaming>& w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto st = w.lock();
    if (st == nullptr || st->fd < 0 || st->woken) return;
    st->woken = true;
    woken_.push_back(w);
  }
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof(one));
}

void ConnectionHub::pump(const std::shared_ptr<Streaming>& st, bool pull) {
  if (st->fd < 0) return;
  const SteadyTime now = Clock::now();
  if (pull && !st->done) {
    st->pulled = now;
    bool done = false;
    const std::string more = st->body.pull(&done);
    if (st->at == st->out.size()) st->progress = now;  // the reader is behind from now on, not before
    if (!more.empty()) st->fresh = st->out.size();
    st->out += more;
    st->done = done;
  }
  while (st->at < st->out.size()) {
    const ssize_t n = send(st->fd, st->out.data() + st->at, st->out.size() - st->at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      st->at += static_cast<size_t>(n);
      st->progress = now;
      st->wrote = true;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else if (n < 0 && errno != EINTR) {
      return drop(st, false, false);  // the client went away
    }
  }
  if (st->at == st->out.size()) {
    st->out.clear();
    st->at = st->fresh = 0;
    if (st->done) drop(st, true, false);
    return;
  }
  // Behind: the bytes of earlier pulls still unsent. The latest pull's bytes do not count, however many a
  // step brought: a reader that keeps up is never dropped for one large pull.
  if (st->fresh > st->at && st->fresh - st->at > limits_.max_stream_buffer_bytes) return drop(st, false, true);
  if (st->at > st->out.size() / 2) {  // keeps the buffer at most twice what is unsent
    st->out.erase(0, st->at);
    st->fresh = st->fresh > st->at ? st->fresh - st->at : 0;
    st->at = 0;
  }
}

void ConnectionHub::drop(const std::shared_ptr<Streaming>& st, bool complete, bool slow) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (st->fd < 0) return;
    const int fd = st->fd;
    st->fd = -1;
    if (complete && st->keep && !stopping_) {
      streams_.erase(fd);
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      wait_locked(fd, Clock::now() + std::chrono::seconds(limits_.keep_alive_timeout_s), true);
    } else {
      close_locked(fd);
    }
  }
  if (slow && metrics_ != nullptr) metrics_->on_slow_reader();
  st->body.closed(complete);
}

void ConnectionHub::check(int fd) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = waiting_.find(fd);
  if (it == waiting_.end()) return;
  peek_.resize(limits_.max_head_bytes + kPeekBody);
  const ssize_t n = recv(fd, peek_.data(), peek_.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {  // closed (or reset) between requests
    close_locked(fd);
    return;
  }
  if (n < 0) return;
  if (it->second.idle) {  // a kept-alive connection's next request starts: its deadline starts now
    it->second.idle = false;
    it->second.deadline = Clock::now() + std::chrono::seconds(limits_.request_timeout_s);
  }
  const std::string_view seen(peek_.data(), static_cast<size_t>(n));
  const size_t end = seen.find("\r\n\r\n");
  const std::string_view head_part =
      seen.substr(0, end == std::string_view::npos ? limits_.max_head_bytes : end + 4);
  if (const std::optional<size_t> at = bare_line_end(head_part)) {
    waiting_.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    lock.unlock();
    answer_and_close(fd, 400, "Bad Request",
                     std::string("request head: every line must end in CRLF (\\r\\n); a bare ") +
                         (head_part[*at] == '\n' ? "LF" : "CR") + " at byte " + std::to_string(*at),
                     "invalid_request_error");
    return;
  }
  if (end == std::string_view::npos || end + 4 > limits_.max_head_bytes) {
    if (seen.size() < limits_.max_head_bytes) return;  // wait for more (under the deadline)
    waiting_.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    lock.unlock();
    answer_and_close(fd, 431, "Request Header Fields Too Large",
                     "request head: larger than " + std::to_string(limits_.max_head_bytes) + " bytes",
                     "invalid_request_error");
    return;
  }
  const HeadCheck head = check_head(seen.substr(0, end));
  if (head.error) {
    waiting_.erase(it);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    lock.unlock();
    answer_and_close(fd, 400, "Bad Request", "request head: " + *head.error, "invalid_request_error");
    return;
  }
  if (seen.size() < end + 4 + head.await_body) return;  // the body is still arriving
  const SteadyTime deadline = it->second.deadline;
  waiting_.erase(it);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  lock.unlock();
  const size_t head_bytes = end + 4;
  dispatch_([this, fd, deadline, head_bytes] { serve_(fd, deadline, head_bytes); });
}

void ConnectionHub::expire(SteadyTime now) {
  std::vector<std::shared_ptr<Streaming>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> late;
    for (const auto& [fd, w] : waiting_)
      if (w.deadline <= now) late.push_back(fd);
    for (int fd : late) {
      if (metrics_ != nullptr && !waiting_[fd].idle) metrics_->on_connection_timeout();
      close_locked(fd);
    }
    for (const auto& [fd, st] : streams_) streams.push_back(st);
  }
  for (const auto& st : streams) {
    if (st->at < st->out.size() && now - st->progress > std::chrono::seconds(limits_.io_timeout_s)) {
      drop(st, false, true);  // took no byte for io_timeout_s
    } else if (now - st->pulled >= kPullEvery) {
      pump(st, true);
    }
  }
}

}  // namespace dc::server
