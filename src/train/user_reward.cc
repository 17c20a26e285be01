// run_user_reward: the user's reward program as a child process (vfork + exec, its own process group, killed
// with the thread that started it), JSON lines in through a socket (no SIGPIPE when it exits early), scores
// out until it exits, under a wall-clock limit; its process group killed at the end whatever happened.
#include "train/user_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <utility>

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

// What the child of vfork needs, all prepared before it: it only makes system calls.
struct SpawnPlan {
  std::vector<char*> argv;  // null-terminated; argv[0] the path (not looked up in PATH)
  int fds[3] = {-1, -1, -1};  // become its stdin, stdout, stderr
  int report_fd = -1;       // close-on-exec: the child writes its errno here when it cannot exec
  pid_t parent = 0;         // this process
  sigset_t child_mask;      // the program's signal mask: empty
};

[[noreturn]] void fail_in_child(int report_fd) {
  const int e = errno;
  const ssize_t ignored = ::write(report_fd, &e, sizeof(e));
  (void)ignored;
  ::_exit(127);
}

// The child's side (after vfork, sharing this process's memory until it execs): its own process group,
// SIGKILL when the thread that started it dies (a killed grpo: PR_SET_PDEATHSIG), the parent's signal
// handlers reset and SIGPIPE back to its default, the descriptors, the exec. Never returns.
[[noreturn]] __attribute__((noinline)) void exec_child(const SpawnPlan& p) {
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa;
    if (sig == SIGKILL || sig == SIGSTOP || ::sigaction(sig, nullptr, &sa) != 0) continue;
    if (sig == SIGPIPE || (sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL)) {
      sa.sa_handler = SIG_DFL;
      sa.sa_flags = 0;
      ::sigaction(sig, &sa, nullptr);
    }
  }
  const int report = ::fcntl(p.report_fd, F_DUPFD_CLOEXEC, 3);  // every descriptor out of 0..2 first
  int moved[3];
  for (int i = 0; i < 3; ++i) moved[i] = ::fcntl(p.fds[i], F_DUPFD_CLOEXEC, 3);
  if (::setpgid(0, 0) != 0 || ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail_in_child(report);
  if (::getppid() != p.parent) ::_exit(127);  // it died already
  for (int i = 0; i < 3; ++i)
    if (moved[i] < 0 || ::dup2(moved[i], i) != i) fail_in_child(report);
  ::pthread_sigmask(SIG_SETMASK, &p.child_mask, nullptr);
  ::execv(p.argv[0], p.argv.data());
  fail_in_child(report);
}

// Starts the program (vfork: no copy of a large process's memory); the pid, or the errno of its exec.
std::pair<pid_t, int> spawn(SpawnPlan& p) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC | O_NONBLOCK) != 0) return {-1, errno};
  Fd report_read{report[0]}, report_write{report[1]};
  p.report_fd = report_write.fd;
  p.parent = ::getpid();
  sigemptyset(&p.child_mask);
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);  // no handler may run in the child before the exec
  const pid_t pid = ::vfork();
  if (pid == 0) exec_child(p);
  const int vfork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) return {-1, vfork_errno};
  report_write.reset();
  // vfork returns once the child has exec'd or written its errno: no wait (a process another thread forks
  // meanwhile may hold a copy of the write end). (Where vfork is a fork, under ThreadSanitizer, a failed exec
  // shows as exit code 127 instead.)
  int exec_errno = 0;
  if (::read(report_read.fd, &exec_errno, sizeof(exec_errno)) != static_cast<ssize_t>(sizeof(exec_errno)))
    return {pid, 0};
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {-1, exec_errno};
}

// The running program; its pid is its process group's id. Leaving it (every way out of run_child) kills
// the group, whatever the program left running in it, and reaps the program.
struct Child {
  pid_t pid = -1;
  int status = 0;  // after finish()
  ~Child() { finish(); }
  void finish() {
    if (pid <= 0) return;
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);  // also when it left its group
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pid = -1;
  }
  // True once it has exited; it stays a zombie (not reaped), so its pid and group id cannot be reused.
  bool exited() const {
    siginfo_t info = {};
    const int rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    return (rc == 0 && info.si_pid == pid) || (rc < 0 && errno == ECHILD);  // (ECHILD: SIGCHLD ignored, reaped)
  }
};

// Moves what `f` holds into `dst` (one read): bytes read, 0 at its end (closed), -1 when none is there now.
ssize_t pump(Fd& f, std::string& dst, bool keep_tail) {
  char buf[65536];
  const ssize_t got = ::read(f.fd, buf, sizeof(buf));
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
    f.reset();
    return 0;
  }
  if (got < 0) return -1;
  dst.append(buf, static_cast<size_t>(got));
  if (keep_tail && dst.size() > 2 * kStderrTail) dst.erase(0, dst.size() - kStderrTail);
  return got;
}

// Spawns argv with stdin from a socket and stdout / stderr to pipes, feeds `input`, collects the output
// until the program EXITS (not until its output closes: a child it left may hold it) or the deadline
// passes; then its process group is killed (Child).
Result<Outcome> run_child(const UserRewardOptions& o, const std::string& input) {
  int sv[2], out_pipe[2], err_pipe[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return io_error("socketpair: " + std::string(std::strerror(errno)));
  Fd in_parent{sv[0]}, in_child{sv[1]};
  if (::pipe2(out_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return io_error("pipe: " + std::string(std::strerror(errno)));
  Fd out_read{out_pipe[0]}, out_write{out_pipe[1]};
  if (::pipe2(err_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return io_error("pipe: " + std::string(std::strerror(errno)));
  Fd err_read{err_pipe[0]}, err_write{err_pipe[1]};
  // The program's ends block as usual (O_NONBLOCK is per open file: clear it on the write ends).
  ::fcntl(out_write.fd, F_SETFL, 0), ::fcntl(err_write.fd, F_SETFL, 0);

  SpawnPlan plan;
  for (const std::string& a : o.argv) plan.argv.push_back(const_cast<char*>(a.c_str()));
  plan.argv.push_back(nullptr);
  plan.fds[0] = in_child.fd, plan.fds[1] = out_write.fd, plan.fds[2] = err_write.fd;
  Child child;
  const auto [pid, spawn_errno] = spawn(plan);
  if (pid < 0)
    return invalid_argument(describe(o) + ": cannot be started (" + std::strerror(spawn_errno) +
                            "); give the path of an executable file");
  child.pid = pid;
  in_child.reset(), out_write.reset(), err_write.reset();
  Fd pidfd{static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))};  // readable at its exit (-1: tick instead)

  Outcome r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_seconds);
  size_t written = 0;
  if (input.empty()) in_parent.reset();
  for (bool exited = false; !exited && !r.too_much_output;) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      return r;
    }
    pollfd fds[4];
    int n = 0;
    for (Fd* f : {&in_parent, &out_read, &err_read, &pidfd})
      if (f->fd >= 0) fds[n++] = {f->fd, static_cast<short>(f == &in_parent ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(fds, n, static_cast<int>(std::min(left * 1000 + 1, pidfd.fd >= 0 ? 1000.0 : 20.0)));
    if (ready < 0 && errno != EINTR) return io_error(describe(o) + ": poll: " + std::strerror(errno));
    exited = child.exited();  // before the reads: what it wrote before its exit is in the pipes then
    if (in_parent.fd >= 0 && exited) in_parent.reset();  // (fds[0] is in_parent while it is open)
    if (in_parent.fd >= 0 && ready > 0 && fds[0].revents != 0) {
      const ssize_t w = ::send(in_parent.fd, input.data() + written, input.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) written += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) in_parent.reset();  // done, or it stopped reading
    }
    // Everything there now (all of it once it has exited; the bytes bounded, as a child it left may write on).
    for (int64_t budget = int64_t{4} * kStderrTail + o.max_output_bytes; budget > 0 && !r.too_much_output;) {
      ssize_t got_out = out_read.fd >= 0 ? pump(out_read, r.out, false) : -1;
      ssize_t got_err = err_read.fd >= 0 ? pump(err_read, r.err, true) : -1;
      r.too_much_output = static_cast<int64_t>(r.out.size()) > o.max_output_bytes;
      if (got_out <= 0 && got_err <= 0) break;
      budget -= std::max<ssize_t>(got_out, 0) + std::max<ssize_t>(got_err, 0);
    }
  }
  if (r.too_much_output) return r;
  child.finish();  // the group killed, the program reaped: its exit status
  r.status = child.status;
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
    return out_of_range(who + ": wrote more than " + std::to_string(o.max_output_bytes) +
                        " bytes (killed); it must write one score per line" + stderr_note(r.err));
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
                              line.substr(0, 80) + "\"); write one score per line, a finite number or nan" +
                              stderr_note(r.err));
    scores.push_back(*v);
  }
  if (scores.size() != items.size())
    return invalid_argument(who + ": wrote " + std::to_string(scores.size()) + " scores for " + std::to_string(items.size()) +
                            " completions; write exactly one line per input line" + stderr_note(r.err));
  return scores;
}

}  // namespace dc::train
