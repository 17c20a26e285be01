// The sandbox (sandbox.h). The caller thread clones the run's init straight into new namespaces
// (raw clone, no glibc fork: the caller may be multithreaded, so the child touches no lock, no
// allocator, only system calls), writes its uid / gid maps, and then pumps stdout / stderr with a
// deadline. The init builds the new root, sets the limits, starts the program, reaps, reports.
#include "sandbox/sandbox.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <ftw.h>
#include <linux/sched.h>
#include <net/if.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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
  }
  return "none";
}

namespace {

constexpr int kInsideId = 1000;  // uid and gid of the program inside its user namespace

// Everything the child needs, built before the clone (the child may not allocate).
struct ChildPlan {
  std::string dir;                                     // the run's host temp dir
  std::string root, work, stdin_path;                  // relative to `dir` (root, work)
  std::vector<std::string> bind_dirs;                  // "/usr", or "/lib" where it is no symlink
  std::vector<unsigned long> bind_dir_flags;           // the source mount's locked flags
  std::vector<std::pair<std::string, std::string>> links;  // name → target, e.g. bin → usr/bin
  std::vector<std::string> etc_files, dev_files;       // bound read-only / as they are
  std::string tmpfs_opts;
  bool clear_groups = false;                           // drop supplementary groups (root callers)
  std::string exe;                                     // resolved argv[0]
  std::vector<std::string> argv_s, env_s;
  std::vector<char*> argv, envp;
  Limits limits;
  // Host paths inside the new root, precomputed.
  std::vector<std::string> root_paths;                 // root + "/" + name for every mount point
};

// ---- child side: only system calls from here to execve ------------------------------------------

[[noreturn]] void child_fail(int status_fd, const char* what) {
  int e = errno;
  char buf[256];
  size_t n = 0;
  buf[n++] = 'E';
  for (const char* p = what; *p && n < sizeof(buf) - 64; ++p) buf[n++] = *p;
  const char* es = ": ";
  for (const char* p = es; *p; ++p) buf[n++] = *p;
  const char* msg = strerrordesc_np(e);
  for (const char* p = msg ? msg : "?"; *p && n < sizeof(buf) - 1; ++p) buf[n++] = *p;
  (void)!write(status_fd, buf, n);
  _exit(1);
}

void set_limit(int resource, int64_t soft, int64_t hard) {
  if (soft <= 0) return;
  struct rlimit r;
  r.rlim_cur = static_cast<rlim_t>(soft);
  r.rlim_max = static_cast<rlim_t>(hard);
  setrlimit(resource, &r);
}

// The run's PID 1. fds: 0 stdin, 1 stdout, 2 stderr, 3 the status pipe, 4 the sync pipe.
[[noreturn]] void child_init(const ChildPlan& p, const std::string* paths) {
  const int status_fd = 3, sync_fd = 4;
  // Die with the caller; then the kernel kills every process of the namespace.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char c;
  if (read(sync_fd, &c, 1) != 1) _exit(1);  // the caller writes our uid / gid maps first
  close(sync_fd);

  // Paths below are relative to the run's dir: its ancestors may be closed to uid 1000.
  if (chdir(p.dir.c_str()) != 0) child_fail(status_fd, "chdir to the sandbox dir");
  // Become uid / gid 1000 of the namespace first (raw system calls: glibc's wrappers would signal
  // the caller's other threads). The capabilities in the new namespace stay until execve, which drops
  // them (no file capabilities, uid ≠ 0); the tmpfs only accepts files of a mapped owner.
  if (p.clear_groups && syscall(SYS_setgroups, 0, nullptr) != 0) child_fail(status_fd, "setgroups");
  if (syscall(SYS_setresgid, kInsideId, kInsideId, kInsideId) != 0) child_fail(status_fd, "setresgid");
  if (syscall(SYS_setresuid, kInsideId, kInsideId, kInsideId) != 0) child_fail(status_fd, "setresuid");
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail(status_fd, "mount / private");
  if (mount("tmpfs", p.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, p.tmpfs_opts.c_str()) != 0)
    child_fail(status_fd, "mount tmpfs root");
  size_t k = 0;  // walks `paths` in the order run() built them
  for (size_t i = 0; i < p.bind_dirs.size(); ++i) {
    const char* dst = paths[k++].c_str();
    if (mkdir(dst, 0755) != 0) child_fail(status_fd, "mkdir bind dir");
    if (mount(p.bind_dirs[i].c_str(), dst, nullptr, MS_BIND | MS_REC, nullptr) != 0)
      child_fail(status_fd, "bind system dir");
    if (mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | p.bind_dir_flags[i],
              nullptr) != 0)
      child_fail(status_fd, "remount system dir read-only");
  }
  for (const auto& l : p.links) {
    if (symlink(l.second.c_str(), paths[k++].c_str()) != 0) child_fail(status_fd, "symlink");
  }
  if (mkdir(paths[k++].c_str(), 0755) != 0) child_fail(status_fd, "mkdir etc");
  for (const auto& f : p.etc_files) {
    const char* dst = paths[k++].c_str();
    int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) child_fail(status_fd, "create etc file");
    close(fd);
    if (mount(f.c_str(), dst, nullptr, MS_BIND, nullptr) == 0)
      mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr);
  }
  if (mkdir(paths[k++].c_str(), 0755) != 0) child_fail(status_fd, "mkdir dev");
  for (const auto& f : p.dev_files) {
    const char* dst = paths[k++].c_str();
    int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
    if (fd < 0) child_fail(status_fd, "create dev node");
    close(fd);
    if (mount(f.c_str(), dst, nullptr, MS_BIND, nullptr) != 0) child_fail(status_fd, "bind dev node");
  }
  const char* proc = paths[k++].c_str();
  if (mkdir(proc, 0555) != 0) child_fail(status_fd, "mkdir proc");
  // A /proc of our PID namespace; a kernel that refuses it (masked host /proc) leaves it empty.
  mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  const char* tmp = paths[k++].c_str();
  if (mkdir(tmp, 01777) != 0) child_fail(status_fd, "mkdir tmp");
  if (mount(p.work.c_str(), tmp, nullptr, MS_BIND, nullptr) != 0) child_fail(status_fd, "bind work dir");
  mount(nullptr, tmp, nullptr, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, nullptr);
  const char* old = paths[k++].c_str();
  if (mkdir(old, 0700) != 0) child_fail(status_fd, "mkdir oldroot");
  if (syscall(SYS_pivot_root, p.root.c_str(), old) != 0) child_fail(status_fd, "pivot_root");
  if (chdir("/") != 0) child_fail(status_fd, "chdir /");
  if (umount2("/.oldroot", MNT_DETACH) != 0) child_fail(status_fd, "detach old root");
  rmdir("/.oldroot");
  if (mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    child_fail(status_fd, "remount root read-only");
  sethostname("sandbox", 7);
  // Bring up the loopback interface (the only one in the new network namespace).
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s >= 0) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
      ifr.ifr_flags |= IFF_UP;
      ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    close(s);
  }
  if (chdir("/tmp") != 0) child_fail(status_fd, "chdir /tmp");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(status_fd, "no_new_privs");
  const Limits& L = p.limits;
  if (L.cpu_seconds > 0) {
    int64_t cpu = static_cast<int64_t>(L.cpu_seconds + 0.999);
    set_limit(RLIMIT_CPU, cpu, cpu + 1);
  }
  set_limit(RLIMIT_AS, L.address_space_bytes, L.address_space_bytes);
  set_limit(RLIMIT_NPROC, L.max_processes, L.max_processes);
  set_limit(RLIMIT_FSIZE, L.file_size_bytes, L.file_size_bytes);
  set_limit(RLIMIT_NOFILE, L.open_files, L.open_files);
  {  // no core files
    struct rlimit r{0, 0};
    setrlimit(RLIMIT_CORE, &r);
  }

  long prog = syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr);
  if (prog < 0) child_fail(status_fd, "start the program");
  if (prog == 0) {
    syscall(SYS_close_range, 3u, ~0u, 0u);
    execve(p.exe.c_str(), p.argv.data(), p.envp.data());
    int e = errno;
    const char* m1 = "sandbox: cannot execute ";
    (void)!write(2, m1, strlen(m1));
    (void)!write(2, p.exe.c_str(), p.exe.size());
    (void)!write(2, ": ", 2);
    const char* m2 = strerrordesc_np(e);
    (void)!write(2, m2, strlen(m2));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  // Reap everything until the program itself ends; what it left behind dies with us.
  for (;;) {
    int st = 0;
    pid_t w = waitpid(-1, &st, __WALL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) child_fail(status_fd, "wait for the program");
    if (w == prog) {
      char buf[1 + sizeof(int)];
      buf[0] = 'S';
      memcpy(buf + 1, &st, sizeof(int));
      (void)!write(status_fd, buf, sizeof(buf));
      _exit(0);
    }
  }
}

// ---- caller side ---------------------------------------------------------------------------------

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

int rm_entry(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_DP || type == FTW_D) return rmdir(path) == 0 || errno == ENOENT ? 0 : 0;
  unlink(path);
  return 0;
}
int chmod_entry(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_D || type == FTW_DNR) chmod(path, 0700);
  return 0;
}

void remove_tree(const std::string& dir) {
  if (geteuid() != 0) nftw(dir.c_str(), chmod_entry, 16, FTW_PHYS);  // undo a program's chmod 000
  nftw(dir.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS);
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

std::string resolve_exe(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  for (const char* dir : {"/usr/local/bin/", "/usr/bin/", "/bin/"}) {
    std::string p = std::string(dir) + name;
    if (access(p.c_str(), X_OK) == 0) return p.rfind("/usr/local/", 0) == 0 ? "/usr/bin/" + name : p;
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

LimitHit classify(const RunResult& r, const Limits& L) {
  if (r.timed_out) return LimitHit::kWallTime;
  if (r.signal == SIGXCPU || (r.signal == SIGKILL && L.cpu_seconds > 0 && r.cpu_seconds >= L.cpu_seconds))
    return LimitHit::kCpuTime;
  if (r.signal == SIGXFSZ) return LimitHit::kFileSize;
  if (r.exited && r.exit_code == 0) return LimitHit::kNone;
  const std::string& e = r.stderr_data;
  auto has = [&](const char* s) { return e.find(s) != std::string::npos; };
  if (has("MemoryError") || has("Cannot allocate memory") || has("std::bad_alloc")) return LimitHit::kMemory;
  if (has("File too large")) return LimitHit::kFileSize;
  if (has("Too many open files")) return LimitHit::kOpenFiles;
  if (has("Resource temporarily unavailable") && (has("fork") || has("thread") || has("spawn")))
    return LimitHit::kProcesses;
  return LimitHit::kNone;
}

}  // namespace

Status check_available() {
  RunSpec spec;
  spec.argv = {"/bin/true"};
  spec.limits.wall_seconds = 10;
  auto r = run(spec);
  if (!r.ok()) return r.status();
  if (!r->ok()) return internal_error("sandbox: /bin/true failed inside the sandbox: " + r->stderr_data);
  return Status::ok_status();
}

Result<RunResult> run(const RunSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) return invalid_argument("sandbox: empty argv");
  if (spec.limits.wall_seconds <= 0) return invalid_argument("sandbox: wall_seconds must be > 0");
  for (const auto& [name, _] : spec.files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return invalid_argument("sandbox: file name '" + name + "' must be a plain name inside the temp dir");
  }
  const char* tmp_env = std::getenv("TMPDIR");
  std::string base = tmp_env && *tmp_env ? tmp_env : "/tmp";
  std::string tmpl = base + "/dc-sandbox-XXXXXX";
  if (!mkdtemp(tmpl.data())) return io_error(errno_text("sandbox: cannot create a temp dir under " + base));
  const std::string dir = tmpl;
  chmod(dir.c_str(), 0711);  // the child, an unprivileged uid by then, must traverse it
  struct Cleanup {
    std::string d;
    ~Cleanup() { remove_tree(d); }
  } cleanup{dir};

  const bool root = geteuid() == 0;
  const uint32_t out_uid = root ? outside_id() : geteuid();
  const uint32_t out_gid = root ? out_uid : getegid();

  ChildPlan p;
  p.dir = dir;
  p.root = "root";
  p.work = "work";
  p.limits = spec.limits;
  p.clear_groups = root;
  const std::string host_work = dir + "/work";
  if (mkdir((dir + "/root").c_str(), 0755) != 0 || mkdir(host_work.c_str(), 0700) != 0)
    return io_error(errno_text("sandbox: cannot create " + dir + "/{root,work}"));
  for (const auto& [name, data] : spec.files) {
    if (!write_file(host_work + "/" + name, data, O_WRONLY | O_CREAT | O_EXCL))
      return io_error(errno_text("sandbox: cannot write " + name));
    if (root && chown((host_work + "/" + name).c_str(), out_uid, out_gid) != 0)
      return io_error(errno_text("sandbox: chown"));
  }
  if (root && chown(host_work.c_str(), out_uid, out_gid) != 0) return io_error(errno_text("sandbox: chown"));
  int stdin_fd;
  if (!spec.stdin_data.empty()) {
    p.stdin_path = dir + "/stdin";
    if (!write_file(p.stdin_path, spec.stdin_data)) return io_error(errno_text("sandbox: cannot write stdin"));
    stdin_fd = open(p.stdin_path.c_str(), O_RDONLY | O_CLOEXEC);
  } else {
    stdin_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (stdin_fd < 0) return io_error(errno_text("sandbox: open stdin"));

  // The new root: /usr and the merged-/usr links (or binds where they are real dirs), a few /etc
  // files, four device nodes, /proc, /tmp.
  p.bind_dirs.push_back("/usr");
  p.bind_dir_flags.push_back(locked_flags("/usr"));
  std::vector<std::string> link_names;
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
      p.bind_dirs.insert(p.bind_dirs.end(), host);
      p.bind_dir_flags.push_back(locked_flags(host));
    }
  }
  for (const char* f : {"ld.so.cache", "ld.so.conf", "localtime", "nsswitch.conf", "host.conf", "mime.types"}) {
    std::string host = std::string("/etc/") + f;
    struct stat st;
    if (stat(host.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      p.etc_files.push_back(host);
    }
  }
  for (const char* f : {"null", "zero", "random", "urandom"}) {
    p.dev_files.push_back(std::string("/dev/") + f);
  }
  // Every path the child creates, in the order child_init walks them.
  {
    std::vector<std::string> ordered;
    for (const auto& d : p.bind_dirs) ordered.push_back(p.root + d);
    for (const auto& l : p.links) ordered.push_back(p.root + "/" + l.first);
    ordered.push_back(p.root + "/etc");
    for (const auto& f : p.etc_files) ordered.push_back(p.root + f);
    ordered.push_back(p.root + "/dev");
    for (const auto& f : p.dev_files) ordered.push_back(p.root + f);
    ordered.push_back(p.root + "/proc");
    ordered.push_back(p.root + "/tmp");
    ordered.push_back(p.root + "/.oldroot");
    p.root_paths = std::move(ordered);
  }
  int64_t tmpfs = spec.limits.tmpfs_bytes > 0 ? spec.limits.tmpfs_bytes : (1 << 20);
  p.tmpfs_opts = "size=" + std::to_string(tmpfs) + ",mode=0755";
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

  int out[2], err[2], status[2], sync[2];
  if (pipe2(out, O_CLOEXEC) != 0) return io_error(errno_text("sandbox: pipe"));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]);
    return io_error(errno_text("sandbox: pipe"));
  }
  if (pipe2(status, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    return io_error(errno_text("sandbox: pipe"));
  }
  if (pipe2(sync, O_CLOEXEC) != 0) {
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1]}) close(fd);
    return io_error(errno_text("sandbox: pipe"));
  }
  const std::string* paths = p.root_paths.data();

  const auto t0 = std::chrono::steady_clock::now();
  const long flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWUTS | SIGCHLD;
  long pid = syscall(SYS_clone, flags, nullptr, nullptr, nullptr, nullptr);
  if (pid == 0) {
    // Child: fds 0..4 as child_init expects, everything else closed.
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
    child_init(p, paths);
  }
  const int clone_errno = errno;
  close(stdin_fd);
  close(out[1]);
  close(err[1]);
  close(status[1]);
  close(sync[0]);
  auto close_rest = [&] {
    close(out[0]);
    close(err[0]);
    close(status[0]);
    close(sync[1]);
  };
  if (pid < 0) {
    close_rest();
    errno = clone_errno;
    return internal_error(errno_text("sandbox: clone with new user/pid/net/ipc/mount namespaces"));
  }
  // Map the child's uid / gid 1000 to an unprivileged outside id.
  {
    std::string proc = "/proc/" + std::to_string(pid);
    // A privileged caller keeps setgroups allowed so the child can drop its supplementary groups;
    // others must deny it before writing a gid map.
    bool ok = (root || write_file(proc + "/setgroups", "deny", O_WRONLY)) &&
              write_file(proc + "/gid_map", std::to_string(kInsideId) + " " + std::to_string(out_gid) + " 1\n", O_WRONLY) &&
              write_file(proc + "/uid_map", std::to_string(kInsideId) + " " + std::to_string(out_uid) + " 1\n", O_WRONLY);
    int map_errno = errno;
    if (!ok) {
      kill(static_cast<pid_t>(pid), SIGKILL);
      waitpid(static_cast<pid_t>(pid), nullptr, 0);
      close_rest();
      errno = map_errno;
      return internal_error(errno_text("sandbox: cannot write the uid / gid map of the sandbox"));
    }
    (void)!write(sync[1], "x", 1);
    close(sync[1]);
  }

  RunResult r;
  const Limits& L = spec.limits;
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
  Stream streams[2] = {{out[0], &r.stdout_data, &r.stdout_truncated}, {err[0], &r.stderr_data, &r.stderr_truncated}};
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
      int64_t cap = L.output_bytes > 0 ? L.output_bytes : INT64_MAX;
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
  int wst = 0;
  struct rusage ru;
  memset(&ru, 0, sizeof(ru));
  while (wait4(static_cast<pid_t>(pid), &wst, 0, &ru) < 0 && errno == EINTR) {
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cpu_seconds = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  r.max_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  // The init's report: 'S' + the program's wait status, or 'E' + why the sandbox could not start.
  std::string report;
  for (;;) {
    ssize_t got = read(status[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    report.append(buf, static_cast<size_t>(got));
  }
  close(out[0]);
  close(err[0]);
  close(status[0]);
  if (!report.empty() && report[0] == 'E') return internal_error("sandbox: " + report.substr(1));
  int st = wst;
  if (report.size() == 1 + sizeof(int) && report[0] == 'S') {
    memcpy(&st, report.data() + 1, sizeof(int));
  } else if (!killed) {
    return internal_error("sandbox: the sandbox's init ended without a report (wait status " + std::to_string(wst) + ")");
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
  if (r.limit == LimitHit::kNone) r.limit = classify(r, L);
  return r;
}

}  // namespace dc::sandbox
