// The run's init (child.h): becomes uid 1000 of its user namespace, builds the new root (a read-only
// tmpfs skeleton with system dirs bound in, and a size-bounded tmpfs /tmp holding copies of the
// staged files), sets the limits, starts the program under the seccomp filter, reaps, reports.
// Only system calls from here to execve (see child.h).
#include "sandbox/child.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dc::sandbox {
namespace {

constexpr int kStatusFd = 3, kSyncFd = 4;

[[noreturn]] void child_fail(const char* what) {
  int e = errno;
  char buf[256];
  size_t n = 0;
  buf[n++] = 'E';
  for (const char* p = what; *p && n < sizeof(buf) - 64; ++p) buf[n++] = *p;
  for (const char* p = ": "; *p; ++p) buf[n++] = *p;
  const char* msg = strerrordesc_np(e);
  for (const char* p = msg ? msg : "?"; *p && n < sizeof(buf) - 1; ++p) buf[n++] = *p;
  (void)!write(kStatusFd, buf, n);
  _exit(1);
}

// Sets a limit, clamped to the hard limit we already have (lowering is all a limit needs); a failure
// fails the run (a program without its limits must not run).
void set_limit(int resource, int64_t soft, int64_t hard, const char* what) {
  if (soft <= 0) return;
  struct rlimit cur;
  if (getrlimit(resource, &cur) != 0) child_fail(what);
  struct rlimit r;
  r.rlim_cur = static_cast<rlim_t>(soft);
  r.rlim_max = static_cast<rlim_t>(hard);
  if (cur.rlim_max != RLIM_INFINITY && r.rlim_max > cur.rlim_max) r.rlim_max = cur.rlim_max;
  if (r.rlim_cur > r.rlim_max) r.rlim_cur = r.rlim_max;
  if (setrlimit(resource, &r) != 0) child_fail(what);
}

// Become uid / gid 1000 of the namespace first (raw system calls: glibc's wrappers would signal the
// caller's other threads). The capabilities in the new namespace stay until execve, which drops them
// (no file capabilities, uid ≠ 0); the tmpfs only accepts files of a mapped owner.
void become_inside_user(const ChildPlan& p) {
  if (p.clear_groups && syscall(SYS_setgroups, 0, nullptr) != 0) child_fail("setgroups");
  if (syscall(SYS_setresgid, kInsideId, kInsideId, kInsideId) != 0) child_fail("setresgid");
  if (syscall(SYS_setresuid, kInsideId, kInsideId, kInsideId) != 0) child_fail("setresuid");
}

void bind_read_only(const char* src, const char* dst, unsigned long locked) {
  if (mount(src, dst, nullptr, MS_BIND | MS_REC, nullptr) != 0) child_fail("bind system dir");
  if (mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | locked, nullptr) != 0)
    child_fail("remount system dir read-only");
}

void create_file(const char* path, mode_t mode, const char* what) {
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, mode);
  if (fd < 0) child_fail(what);
  close(fd);
}

// Copies one staged file into the run's /tmp (a 16 KiB buffer on the stack, no allocation).
void copy_file(const char* src, const char* dst) {
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) child_fail("open a staged file");
  int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) child_fail("create a file in /tmp");
  char buf[16384];
  for (;;) {
    ssize_t got = read(in, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) child_fail("read a staged file");
    if (got == 0) break;
    for (ssize_t off = 0; off < got;) {
      ssize_t w = write(out, buf + off, static_cast<size_t>(got - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) child_fail("copy RunSpec::files into /tmp (larger than Limits::tmp_bytes?)");
      off += w;
    }
  }
  close(in);
  close(out);
}

// Builds the new root under p.root (paths relative to the run's dir: its ancestors may be closed to
// uid 1000) and pivots into it; the root is read-only afterwards, /tmp (a tmpfs of its own) is not.
void mount_root(const ChildPlan& p) {
  const std::string* paths = p.root_paths.data();
  size_t k = 0;  // walks `paths` in the order run() built them
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail("mount / private");
  if (mount("tmpfs", p.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, p.tmpfs_opts.c_str()) != 0)
    child_fail("mount tmpfs root");
  for (size_t i = 0; i < p.bind_dirs.size(); ++i) {
    const char* dst = paths[k++].c_str();
    if (mkdir(dst, 0755) != 0) child_fail("mkdir bind dir");
    bind_read_only(p.bind_dirs[i].c_str(), dst, p.bind_dir_flags[i]);
  }
  for (const auto& l : p.links) {
    if (symlink(l.second.c_str(), paths[k++].c_str()) != 0) child_fail("symlink");
  }
  if (mkdir(paths[k++].c_str(), 0755) != 0) child_fail("mkdir etc");
  for (const auto& f : p.etc_files) {
    const char* dst = paths[k++].c_str();
    create_file(dst, 0644, "create etc file");
    if (mount(f.c_str(), dst, nullptr, MS_BIND, nullptr) == 0)
      mount(nullptr, dst, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr);
  }
  if (mkdir(paths[k++].c_str(), 0755) != 0) child_fail("mkdir dev");
  for (const auto& f : p.dev_files) {
    const char* dst = paths[k++].c_str();
    create_file(dst, 0666, "create dev node");
    if (mount(f.c_str(), dst, nullptr, MS_BIND, nullptr) != 0) child_fail("bind dev node");
  }
  // POSIX shared memory and semaphores (multiprocessing's locks) live in /dev/shm: the run's /tmp, so
  // they count against Limits::tmp_bytes.
  if (symlink("/tmp", paths[k++].c_str()) != 0) child_fail("symlink /dev/shm");
  const char* proc = paths[k++].c_str();
  if (mkdir(proc, 0555) != 0) child_fail("mkdir proc");
  // A /proc of our PID namespace; a kernel that refuses it (masked host /proc) leaves it empty.
  mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  const char* tmp = paths[k++].c_str();
  if (mkdir(tmp, 01777) != 0) child_fail("mkdir tmp");
  // The writable /tmp: a tmpfs of Limits::tmp_bytes of this mount namespace (gone with it), never the
  // host's disk. tmpfs pages are the run's memory (charged to its cgroup where there is one).
  if (mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, p.tmp_opts.c_str()) != 0) child_fail("mount tmpfs /tmp");
  for (size_t i = 0; i < p.stage_files.size(); ++i) copy_file(p.stage_files[i].c_str(), p.tmp_files[i].c_str());
  const char* old = paths[k++].c_str();
  if (mkdir(old, 0700) != 0) child_fail("mkdir oldroot");
  if (syscall(SYS_pivot_root, p.root.c_str(), old) != 0) child_fail("pivot_root");
  if (chdir("/") != 0) child_fail("chdir /");
  if (umount2("/.oldroot", MNT_DETACH) != 0) child_fail("detach old root");
  rmdir("/.oldroot");
  if (mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    child_fail("remount root read-only");
}

// Brings up the loopback interface (the only one in the new network namespace).
void bring_up_loopback() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  close(s);
}

void set_limits(const Limits& L) {
  if (L.cpu_seconds > 0) {
    int64_t cpu = static_cast<int64_t>(L.cpu_seconds + 0.999);
    set_limit(RLIMIT_CPU, cpu, cpu + 1, "setrlimit RLIMIT_CPU");
  }
  set_limit(RLIMIT_AS, L.address_space_bytes, L.address_space_bytes, "setrlimit RLIMIT_AS");
  set_limit(RLIMIT_NPROC, L.max_processes, L.max_processes, "setrlimit RLIMIT_NPROC");
  set_limit(RLIMIT_FSIZE, L.file_size_bytes, L.file_size_bytes, "setrlimit RLIMIT_FSIZE");
  set_limit(RLIMIT_NOFILE, L.open_files, L.open_files, "setrlimit RLIMIT_NOFILE");
  struct rlimit none{0, 0};  // no core files
  if (setrlimit(RLIMIT_CORE, &none) != 0) child_fail("setrlimit RLIMIT_CORE");
}

// The program's process: the seccomp filter (after NO_NEW_PRIVS, which the init set), no descriptors
// but 0-2, execve. A failed execve is an ordinary result: 127 and the reason on stderr.
[[noreturn]] void exec_program(const ChildPlan& p) {
  if (p.filter.len > 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p.filter, 0, 0) != 0)
    child_fail("install the seccomp filter");
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

}  // namespace

[[noreturn]] void child_init(const ChildPlan& p) {
  // Die with the caller; then the kernel kills every process of the namespace.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char c;
  if (read(kSyncFd, &c, 1) != 1) _exit(1);  // the caller writes our uid / gid maps first
  close(kSyncFd);
  if (chdir(p.dir.c_str()) != 0) child_fail("chdir to the sandbox dir");
  become_inside_user(p);
  mount_root(p);
  sethostname("sandbox", 7);
  bring_up_loopback();
  if (chdir("/tmp") != 0) child_fail("chdir /tmp");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail("no_new_privs");
  set_limits(p.limits);

  long prog = syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr);
  if (prog < 0) child_fail("start the program");
  if (prog == 0) exec_program(p);
  // Reap everything until the program itself ends; what it left behind dies with us.
  for (;;) {
    int st = 0;
    pid_t w = waitpid(-1, &st, __WALL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) child_fail("wait for the program");
    if (w == prog) {
      char buf[1 + sizeof(int)];
      buf[0] = 'S';
      memcpy(buf + 1, &st, sizeof(int));
      (void)!write(kStatusFd, buf, sizeof(buf));
      _exit(0);
    }
  }
}

}  // namespace dc::sandbox
