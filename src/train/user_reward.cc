// run_user_reward: the user's reward program as a child process (posix_spawn, its own process group),
// JSON lines in through a socket (no SIGPIPE when it exits early), scores out, under a wall-clock limit.
#include "train/user_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

extern char** environ;

namespace dc::train {
namespace {

constexpr size_t kStderrTail = 64 << 10;

struct Fd {
  int fd = -1;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

std::string describe(const UserRewardOptions& o) { return "reward program " + o.argv[0]; }

std::string stderr_note(const std::string& err) {
  if (err.empty()) return "";
  return "; its stderr ends:\n" + (err.size() > 2000 ? err.substr(err.size() - 2000) : err);
}

// One score line: a number (JSON syntax, blanks around it allowed) or nan / NaN. Infinity is refused.
std::optional<double> parse_score(std::string line) {
  const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
  if (b == std::string::npos) return std::nullopt;
  line = line.substr(b, e - b + 1);
  if (line == "nan" || line == "NaN") return std::nan("");
  if (line.find_first_not_of("0123456789+-.eE") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(line.c_str(), &end);
  if (end != line.c_str() + line.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

struct Outcome {
  std::string out, err;
  bool timed_out = false, too_much_output = false;
  int status = 0;
};

// Spawns argv with stdin from a socket and stdout / stderr to pipes, feeds `input`, collects the output
// until the program exits or the deadline passes (then its process group is killed).
Result<Outcome> run_child(const UserRewardOptions& o, const std::string& input) {
  int sv[2], out_pipe[2], err_pipe[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return io_error("socketpair: " + std::string(std::strerror(errno)));
  Fd in_parent{sv[0]}, in_child{sv[1]};
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return io_error("pipe: " + std::string(std::strerror(errno)));
  Fd out_read{out_pipe[0]}, out_write{out_pipe[1]};
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return io_error("pipe: " + std::string(std::strerror(errno)));
  Fd err_read{err_pipe[0]}, err_write{err_pipe[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_child.fd, 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_write.fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  std::vector<char*> argv;
  for (const std::string& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0)
    return invalid_argument(describe(o) + ": cannot be started (" + std::strerror(spawned) +
                            "); give the path of an executable file");
  in_child.reset(), out_write.reset(), err_write.reset();

  Outcome r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_seconds);
  size_t written = 0;
  if (input.empty()) in_parent.reset();
  char buf[65536];
  while (out_read.fd >= 0 || err_read.fd >= 0) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd fds[3];
    int n = 0;
    for (Fd* f : {&in_parent, &out_read, &err_read})
      if (f->fd >= 0) fds[n++] = {f->fd, static_cast<short>(f == &in_parent ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(fds, n, static_cast<int>(std::min(left * 1000 + 1, 1000.0)));
    if (ready < 0 && errno != EINTR) return io_error(describe(o) + ": poll: " + std::strerror(errno));
    for (int k = 0; k < n && ready > 0; ++k) {
      if (fds[k].revents == 0) continue;
      if (fds[k].fd == in_parent.fd) {
        const ssize_t w = ::send(in_parent.fd, input.data() + written, input.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) written += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) in_parent.reset();  // done, or it stopped reading
        continue;
      }
      Fd& f = fds[k].fd == out_read.fd ? out_read : err_read;
      const ssize_t got = ::read(f.fd, buf, sizeof(buf));
      if (got <= 0) {
        if (got == 0 || (errno != EAGAIN && errno != EINTR)) f.reset();
        continue;
      }
      std::string& dst = &f == &out_read ? r.out : r.err;
      dst.append(buf, static_cast<size_t>(got));
      if (&f == &err_read && dst.size() > 2 * kStderrTail) dst.erase(0, dst.size() - kStderrTail);
      if (&f == &out_read && static_cast<int64_t>(dst.size()) > o.max_output_bytes) r.too_much_output = true;
    }
    if (r.too_much_output) break;
  }
  // Output closed: wait for the exit, still under the deadline (it may have closed stdout and run on).
  while (!r.timed_out && !r.too_much_output) {
    const pid_t done = ::waitpid(pid, &r.status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return r;
    if (std::chrono::steady_clock::now() >= deadline) r.timed_out = true;
    else ::usleep(2000);
  }
  ::kill(-pid, SIGKILL);
  while (::waitpid(pid, &r.status, 0) < 0 && errno == EINTR) {
  }
  return r;
}

}  // namespace

Result<std::vector<double>> run_user_reward(const std::vector<UserRewardItem>& items, const UserRewardOptions& o) {
  if (o.argv.empty() || o.argv[0].empty()) return invalid_argument("reward program: no executable given");
  if (!(o.timeout_seconds > 0)) return invalid_argument("reward program timeout: must be > 0 seconds");
  std::string input;
  for (const UserRewardItem& it : items) {
    nlohmann::json line = {{"prompt", it.prompt}, {"completion", it.completion},
                           {"example", it.example != nullptr ? *it.example : nlohmann::json::object()}};
    input += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  DC_ASSIGN_OR_RETURN(Outcome r, run_child(o, input));
  const std::string who = describe(o);
  if (r.timed_out)
    return out_of_range(who + ": did not finish within " + std::to_string(o.timeout_seconds) +
                        " s (killed); make it faster or raise its timeout" + stderr_note(r.err));
  if (r.too_much_output)
    return out_of_range(who + ": wrote more than " + std::to_string(o.max_output_bytes) + " bytes (killed); it must write one score per line");
  if (WIFSIGNALED(r.status))
    return invalid_argument(who + ": killed by signal " + std::to_string(WTERMSIG(r.status)) + stderr_note(r.err));
  if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0)
    return invalid_argument(who + ": exited with code " + std::to_string(WEXITSTATUS(r.status)) + stderr_note(r.err));
  std::vector<double> scores;
  std::istringstream lines(r.out);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    const std::optional<double> v = parse_score(line);
    if (!v)
      return invalid_argument(who + ": output line " + std::to_string(line_no) + " is not a number (\"" +
                              line.substr(0, 80) + "\"); write one score per line, a finite number or nan");
    scores.push_back(*v);
  }
  if (scores.size() != items.size())
    return invalid_argument(who + ": wrote " + std::to_string(scores.size()) + " scores for " + std::to_string(items.size()) +
                            " completions; write exactly one line per input line");
  return scores;
}

}  // namespace dc::train
