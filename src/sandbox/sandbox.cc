// The sandbox (sandbox.h), caller side. The caller thread clones the run's init straight into new
// namespaces (raw clone, no glibc fork: the caller may be multithreaded, so the child touches no lock,
// no allocator, only system calls: child.cc), writes its uid / gid maps, puts it in the run's cgroup
// (where there is one), and then pumps stdout / stderr with a deadline.
#include "sandbox/sandbox.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"
#include "core/pages.h"
#include "sandbox/cgroup.h"
#include "sandbox/child.h"
#include "sandbox/remove_tree.h"
#include "sandbox/seccomp_filter.h"

namespace dc::sandbox {

const char* limit_hit_name(LimitHit hit) {
  switch (hit) {
    case LimitHit::kNone: return "none";
    case LimitHit::kWallTime: return "wall_time";
    case LimitHit::kCpuTime: return "cpu_time";
    case LimitHit::kOutput: return "output";
    case LimitHit::kFileSize: return "file_size";
    case LimitHit::kMemory: return "memory";
    case LimitHit::kProcesses: return "processes";
    case LimitHit::kOpenFiles: return "open_files";
    case LimitHit::kDisk: return "disk";
  }
  return "none";
}

namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_file(const std::string& path, const std::string& data, int flags = O_WRONLY | O_CREAT | O_TRUNC) {
  int fd = open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, data.data(), data.size());
  close(fd);
  return ok;
}

// The flags of the mount holding `path` that a user namespace may not clear (they are locked).
unsigned long locked_flags(const std::string& path) {
  struct statvfs s;
  if (statvfs(path.c_str(), &s) != 0) return 0;
  unsigned long f = 0;
  if (s.f_flag & ST_NODEV) f |= MS_NODEV;
  if (s.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  if (s.f_flag & ST_NOATIME) f |= MS_NOATIME;
  if (s.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
  if (s.f_flag & ST_RELATIME) f |= MS_RELATIME;
  return f;
}

// argv[0] as found on the sandbox's own PATH order; /usr/local is under the bound /usr, so what is
// found there is what runs. Not found: /usr/bin/<name>, whose execve then fails (exit 127, a message).
std::string resolve_exe(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  for (const char* dir : {"/usr/local/bin/", "/usr/bin/", "/bin/"}) {
    std::string p = std::string(dir) + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "/usr/bin/" + name;
}

std::atomic<uint32_t> g_run_counter{0};

// An unprivileged outside uid / gid for this run: distinct for concurrent runs of this process and
// very likely of other processes (mixes in the pid). Root only; others map their own ids.
uint32_t outside_id() {
  uint32_t n = g_run_counter.fetch_add(1);
  return 200000u + (static_cast<uint32_t>(getpid()) * 97u + n) % 100000u;
}

LimitHit classify(const RunResult& r, const Limits& L, const RunCgroup::Events& cg) {
  if (r.timed_out) return LimitHit::kWallTime;
  if (r.signal == SIGXCPU || (r.signal == SIGKILL && L.cpu_seconds > 0 && r.cpu_seconds >= L.cpu_seconds))
    return LimitHit::kCpuTime;
  if (r.signal == SIGXFSZ) return LimitHit::kFileSize;
  if (cg.oom_killed) return LimitHit::kMemory;  // even if the program's parent exited 0 afterwards
  if (r.exited && r.exit_code == 0) return LimitHit::kNone;
  const std::string& e = r.stderr_data;
  auto has = [&](const char* s) { return e.find(s) != std::string::npos; };
  if (has("MemoryError") || has("Cannot allocate memory") || has("std::bad_alloc")) return LimitHit::kMemory;
  if (has("File too large")) return LimitHit::kFileSize;
  if (has("No space left on device")) return LimitHit::kDisk;
  if (has("Too many open files")) return LimitHit::kOpenFiles;
  if ((cg.pids_max || has("Resource temporarily unavailable")) && (has("fork") || has("thread") || has("spawn")))
    return LimitHit::kProcesses;
  return LimitHit::kNone;
}

constexpr double kMaxSeconds = 1e6;

Status validate(const RunSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) return invalid_argument("sandbox: empty argv");
  // (Bounded: a deadline of 1e30 s overflows the clock, and inf or NaN are no time at all.)
  if (!(spec.limits.wall_seconds > 0 && spec.limits.wall_seconds <= kMaxSeconds))
    return invalid_argument("sandbox: wall_seconds must be in (0, 1e6]");
  if (!(spec.limits.cpu_seconds >= 0 && spec.limits.cpu_seconds <= kMaxSeconds))
    return invalid_argument("sandbox: cpu_seconds must be in [0, 1e6] (0: no limit)");
  int64_t total = 0;
  for (const auto& [name, data] : spec.files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return invalid_argument("sandbox: file name '" + name + "' must be a plain name inside the temp dir");
    total += static_cast<int64_t>(data.size()) + 4096;  // a tmpfs page at least per file
  }
  if (spec.limits.tmp_bytes > 0 && total > spec.limits.tmp_bytes)
    return invalid_argument("sandbox: RunSpec::files (" + std::to_string(total) + " bytes with their pages) do not fit "
                            "in Limits::tmp_bytes (" + std::to_string(spec.limits.tmp_bytes) + ")");
  return Status::ok_status();
}

// The run's host dir: `root` (the new root's mount point) and `stage` (RunSpec::files, which the
// init copies into the run's /tmp tmpfs), owned by the run's outside uid.
Status stage_files(const RunSpec& spec, ChildPlan& p, bool root, uint32_t out_uid, uint32_t out_gid) {
  const std::string stage = p.dir + "/" + p.stage;
  if (mkdir((p.dir + "/" + p.root).c_str(), 0755) != 0 || mkdir(stage.c_str(), 0700) != 0)
    return io_error(errno_text("sandbox: cannot create " + p.dir + "/{root,stage}"));
  for (const auto& [name, data] : spec.files) {
    const std::string host = stage + "/" + name;
    if (!write_file(host, data, O_WRONLY | O_CREAT | O_EXCL))
      return io_error(errno_text("sandbox: cannot write " + host));
    if (root && chown(host.c_str(), out_uid, out_gid) != 0) return io_error(errno_text("sandbox: chown " + host));
    p.stage_files.push_back(p.stage + "/" + name);
    p.tmp_files.push_back(p.root + "/tmp/" + name);
  }
  if (root && chown(stage.c_str(), out_uid, out_gid) != 0) return io_error(errno_text("sandbox: chown " + stage));
  return Status::ok_status();
}

// The new root: /usr and the merged-/usr links (or binds where they are real dirs), a few /etc
// files, four device nodes, /proc, /tmp; and every path the child creates, in its order.
void plan_root(ChildPlan& p) {
  p.bind_dirs.push_back("/usr");
  p.bind_dir_flags.push_back(locked_flags("/usr"));
  for (const char* d : {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}) {
    std::string host = std::string("/") + d;
    struct stat st;
    if (lstat(host.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = readlink(host.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      p.links.push_back({d, std::string(target, static_cast<size_t>(n))});
    } else if (S_ISDIR(st.st_mode)) {
      p.bind_dirs.push_back(host);
      p.bind_dir_flags.push_back(locked_flags(host));
    }
  }
  for (const char* f : {"ld.so.cache", "ld.so.conf", "localtime", "nsswitch.conf", "host.conf", "mime.types"}) {
    std::string host = std::string("/etc/") + f;
    struct stat st;
    if (stat(host.c_str(), &st) == 0 && S_ISREG(st.st_mode)) p.etc_files.push_back(host);
  }
  for (const char* f : {"null", "zero", "random", "urandom"}) p.dev_files.push_back(std::string("/dev/") + f);
  auto& o = p.root_paths;
  for (const auto& d : p.bind_dirs) o.push_back(p.root + d);
  for (const auto& l : p.links) o.push_back(p.root + "/" + l.first);
  o.push_back(p.root + "/etc");
  for (const auto& f : p.etc_files) o.push_back(p.root + f);
  o.push_back(p.root + "/dev");
  for (const auto& f : p.dev_files) o.push_back(p.root + f);
  o.push_back(p.root + "/dev/shm");
  o.push_back(p.root + "/proc");
  o.push_back(p.root + "/tmp");
  o.push_back(p.root + "/.oldroot");
}

void plan_program(const RunSpec& spec, ChildPlan& p) {
  const int64_t skeleton = spec.limits.tmpfs_bytes > 0 ? spec.limits.tmpfs_bytes : (1 << 20);
  p.tmpfs_opts = "size=" + std::to_string(skeleton) + ",mode=0755";
  p.tmp_opts = "mode=1777";
  if (spec.limits.tmp_bytes > 0) p.tmp_opts += ",size=" + std::to_string(spec.limits.tmp_bytes);
  p.exe = resolve_exe(spec.argv[0]);
  p.argv_s = spec.argv;
  std::map<std::string, std::string> env = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}, {"TMPDIR", "/tmp"},
                                            {"LANG", "C.UTF-8"}, {"PYTHONDONTWRITEBYTECODE", "1"}};
  for (const auto& [k, v] : spec.env) env[k] = v;
  for (const auto& [k, v] : env) p.env_s.push_back(k + "=" + v);
  for (auto& s : p.argv_s) p.argv.push_back(s.data());
  p.argv.push_back(nullptr);
  for (auto& s : p.env_s) p.envp.push_back(s.data());
  p.envp.push_back(nullptr);
}

// The caller's ends of the run's pipes; closes what is still open.
struct Pipes {
  int out = -1, err = -1, status = -1, sync = -1;
  ~Pipes() {
    for (int fd : {out, err, status, sync})
      if (fd >= 0) close(fd);
  }
};

// Clones the init with fds 0..4 as child_init expects; returns its pid (the caller's ends in `pipes`).
// A plain clone, not CLONE_VM: the init outlives this call and never execs, and an init sharing our memory
// would share our OOM fate (the OOM killer kills every process using the victim's memory). It copies our
// page tables, except those of the engine's large buffers (core/pages.h: advised MADV_DONTFORK while
// `left_behind` lives), which the child never touches: it reads `p` (ordinary memory), its stack copy and descriptors only.
Result<long> spawn(const ChildPlan& p, int stdin_fd, Pipes& pipes) {
  int out[2], err[2], status[2], sync[2];
  int* all[4] = {out, err, status, sync};
  for (int i = 0; i < 4; ++i) {
    if (pipe2(all[i], O_CLOEXEC) != 0) {
      const Status s = io_error(errno_text("sandbox: pipe"));
      for (int j = 0; j < i; ++j) close(all[j][0]), close(all[j][1]);
      return s;
    }
  }
  const long flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWUTS | SIGCHLD;
  long pid = 0;
  int clone_errno = 0;
  {
    const PagesLeftBehind left_behind;  // the engine's large buffers stay here (the child never leaves the block)
    pid = syscall(SYS_clone, flags, nullptr, nullptr, nullptr, nullptr);
    clone_errno = errno;
    if (pid == 0) {
      int fds[5] = {stdin_fd, out[1], err[1], status[1], sync[0]};
      // Move the sources above 4 first so the dup2s below do not clobber one another.
      for (int& fd : fds) {
        int moved = static_cast<int>(syscall(SYS_fcntl, fd, F_DUPFD, 10));
        if (moved < 0) _exit(1);
        fd = moved;
      }
      for (int i = 0; i < 5; ++i)
        if (dup2(fds[i], i) < 0) _exit(1);
      syscall(SYS_close_range, 5u, ~0u, 0u);
      child_init(p);
    }
  }
  close(out[1]), close(err[1]), close(status[1]), close(sync[0]);
  pipes.out = out[0], pipes.err = err[0], pipes.status = status[0], pipes.sync = sync[1];
  if (pid < 0) {
    errno = clone_errno;
    return internal_error(errno_text("sandbox: clone with new user/pid/net/ipc/mount namespaces"));
  }
  return pid;
}

// Maps the child's uid / gid 1000 to the outside ids.
bool write_id_maps(long pid, bool root, uint32_t out_uid, uint32_t out_gid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  // A privileged caller keeps setgroups allowed so the child can drop its supplementary groups;
  // others must deny it before writing a gid map.
  const std::string in = std::to_string(kInsideId) + " ";
  return (root || write_file(proc + "/setgroups", "deny", O_WRONLY)) &&
         write_file(proc + "/gid_map", in + std::to_string(out_gid) + " 1\n", O_WRONLY) &&
         write_file(proc + "/uid_map", in + std::to_string(out_uid) + " 1\n", O_WRONLY);
}

// Reads stdout / stderr into `r` until both close, killing the init at the deadline or on overflow.
// Returns whether it killed the init.
bool pump(long pid, const Limits& L, std::chrono::steady_clock::time_point t0, Pipes& pipes, RunResult& r) {
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(L.wall_seconds));
  bool killed = false;
  auto kill_tree = [&] {
    if (!killed) kill(static_cast<pid_t>(pid), SIGKILL);  // the init: the kernel kills the rest
    killed = true;
  };
  struct Stream {
    int fd;
    std::string* data;
    bool* truncated;
    bool open = true;
  };
  Stream streams[2] = {{pipes.out, &r.stdout_data, &r.stdout_truncated},
                       {pipes.err, &r.stderr_data, &r.stderr_truncated}};
  const int64_t cap = L.output_bytes > 0 ? L.output_bytes : INT64_MAX;
  char buf[65536];
  while (streams[0].open || streams[1].open) {
    auto now = std::chrono::steady_clock::now();
    int timeout_ms = -1;
    if (!killed) {
      if (now >= deadline) {
        r.timed_out = true;
        kill_tree();
        continue;
      }
      timeout_ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    }
    struct pollfd pfd[2];
    int n = 0, idx[2];
    for (int i = 0; i < 2; ++i) {
      if (!streams[i].open) continue;
      pfd[n] = {streams[i].fd, POLLIN, 0};
      idx[n++] = i;
    }
    int pr = poll(pfd, static_cast<nfds_t>(n), timeout_ms);
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
    for (int j = 0; j < n; ++j) {
      if (!(pfd[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = streams[idx[j]];
      ssize_t got = read(s.fd, buf, sizeof(buf));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        s.open = false;
        continue;
      }
      int64_t room = cap - static_cast<int64_t>(s.data->size());
      if (room >= got) {
        s.data->append(buf, static_cast<size_t>(got));
      } else {
        if (room > 0) s.data->append(buf, static_cast<size_t>(room));
        *s.truncated = true;
        if (r.limit == LimitHit::kNone && !r.timed_out) r.limit = LimitHit::kOutput;
        kill_tree();
      }
    }
  }
  return killed;
}

// Waits for the init and reads its report into `r` ('S' + the program's wait status, or 'E' + why
// the sandbox could not start: an error).
Status collect(long pid, bool killed, std::chrono::steady_clock::time_point t0, Pipes& pipes, RunResult& r) {
  int wst = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof(ru));
  while (wait4(static_cast<pid_t>(pid), &wst, 0, &ru) < 0 && errno == EINTR) {
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cpu_seconds = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  r.max_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  std::string report;
  char buf[512];
  for (;;) {
    ssize_t got = read(pipes.status, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    report.append(buf, static_cast<size_t>(got));
  }
  if (!report.empty() && report[0] == 'E') return internal_error("sandbox: " + report.substr(1));
  int st = wst;
  if (report.size() == 1 + sizeof(int) && report[0] == 'S') {
    memcpy(&st, report.data() + 1, sizeof(int));
  } else if (!killed) {
    return internal_error("sandbox: the sandbox's init ended without a report (wait status " +
                          std::to_string(wst) + ")");
  }
  if (report.empty()) {  // killed by us before the program ended
    r.exited = false;
    r.signal = SIGKILL;
  } else if (WIFEXITED(st)) {
    r.exited = true;
    r.exit_code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
  }
  return Status::ok_status();
}

// Starts the planned run, waits for it, fills `r`.
Status execute(const ChildPlan& p, const Limits& L, int stdin_fd, bool root, uint32_t out_uid, uint32_t out_gid,
               RunResult& r) {
  RunCgroup cgroup;
  const CgroupSupport& cg = cgroup_support();
  if (cg.usable && L.memory_bytes > 0) {
    Status s = cgroup.create(cg.base, L);
    if (!s.ok()) return s;
  }
  Pipes pipes;
  const auto t0 = std::chrono::steady_clock::now();
  Result<long> pid = spawn(p, stdin_fd, pipes);
  if (!pid.ok()) return pid.status();
  Status started = write_id_maps(*pid, root, out_uid, out_gid)
                       ? Status::ok_status()
                       : internal_error(errno_text("sandbox: cannot write the uid / gid map of the sandbox"));
  if (started.ok() && cg.usable && L.memory_bytes > 0) started = cgroup.attach(*pid);
  if (!started.ok()) {
    kill(static_cast<pid_t>(*pid), SIGKILL);
    waitpid(static_cast<pid_t>(*pid), nullptr, 0);
    return started;
  }
  (void)!write(pipes.sync, "x", 1);
  close(pipes.sync);
  pipes.sync = -1;
  const bool killed = pump(*pid, L, t0, pipes, r);
  Status s = collect(*pid, killed, t0, pipes, r);
  if (!s.ok()) return s;
  const RunCgroup::Events events = cgroup.events();
  cgroup.finish();
  if (r.limit == LimitHit::kNone) r.limit = classify(r, L, events);
  return Status::ok_status();
}

}  // namespace

MemoryMode memory_mode() { return cgroup_support().usable ? MemoryMode::kCgroup : MemoryMode::kRlimit; }

std::string describe() {
  const CgroupSupport& cg = cgroup_support();
  if (cg.usable) return "sandbox: memory per run: " + cg.reason;
  return "sandbox: memory per run: no usable cgroup v2 (" + cg.reason +
         "); per-process RLIMIT_AS and RLIMIT_NPROC lowered so that processes x address space <= the run's memory";
}

Limits effective_limits(const Limits& limits) {
  Limits l = limits;
  if (memory_mode() == MemoryMode::kCgroup || l.memory_bytes <= 0) return l;
  const int64_t mem = l.memory_bytes;
  int64_t as = l.address_space_bytes > 0 ? l.address_space_bytes : INT64_MAX;
  int64_t np = l.max_processes > 0 ? l.max_processes : INT64_MAX;
  const int64_t share = np == INT64_MAX ? 0 : mem / np;
  as = std::min(as, std::max(std::min(kMinProcessBytes, mem), share));
  np = std::min(np, std::max<int64_t>(1, mem / as));
  l.address_space_bytes = as;
  l.max_processes = np;
  return l;
}

Status check_available() {
  Result<sock_fprog> filter = seccomp_program();
  if (!filter.ok()) return filter.status();
  RunSpec spec;
  spec.argv = {"/bin/true"};
  spec.limits.wall_seconds = 10;
  auto r = run(spec);
  if (!r.ok()) return r.status();
  if (!r->ok()) return internal_error("sandbox: /bin/true failed inside the sandbox: " + r->stderr_data);
  return Status::ok_status();
}

namespace {

// One run in its host dir `dir` (made by run(), removed by it afterwards).
Result<RunResult> run_in(const RunSpec& spec, const std::string& dir, const sock_fprog& filter) {
  chmod(dir.c_str(), 0711);  // the child, an unprivileged uid by then, must traverse it
  const bool root = geteuid() == 0;
  const uint32_t out_uid = root ? outside_id() : geteuid();
  const uint32_t out_gid = root ? out_uid : getegid();
  ChildPlan p;
  p.dir = dir;
  p.root = "root";
  p.stage = "stage";
  p.limits = effective_limits(spec.limits);
  p.clear_groups = root;
  p.filter = filter;
  if (Status s = stage_files(spec, p, root, out_uid, out_gid); !s.ok()) return s;
  int stdin_fd;
  if (!spec.stdin_data.empty()) {
    const std::string path = p.dir + "/stdin";
    if (!write_file(path, spec.stdin_data)) return io_error(errno_text("sandbox: cannot write stdin"));
    stdin_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } else {
    stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (stdin_fd < 0) return io_error(errno_text("sandbox: open stdin"));
  plan_root(p);
  plan_program(spec, p);
  RunResult r;
  Status s = execute(p, p.limits, stdin_fd, root, out_uid, out_gid, r);
  close(stdin_fd);
  if (!s.ok()) return s;
  return r;
}

}  // namespace

Result<RunResult> run(const RunSpec& spec) {
  if (Status s = validate(spec); !s.ok()) return s;
  Result<sock_fprog> filter = seccomp_program();
  if (!filter.ok()) return filter.status();
  const char* tmp_env = std::getenv("TMPDIR");
  std::string base = tmp_env && *tmp_env ? tmp_env : "/tmp";
  std::string dir = base + "/dc-sandbox-XXXXXX";
  if (!mkdtemp(dir.data())) return io_error(errno_text("sandbox: cannot create a temp dir under " + base));
  Result<RunResult> r = run_in(spec, dir, *filter);
  // The host dir holds only what we staged (the program writes to its tmpfs), but a failure to
  // remove it is reported, never silent: in the result and through the log.
  if (Status s = remove_tree(dir); !s.ok()) {
    const std::string msg = "sandbox: " + s.message();
    log(LogLevel::kError, msg);
    if (r.ok()) r->cleanup_error = msg;
  }
  return r;
}

}  // namespace dc::sandbox
