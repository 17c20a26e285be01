// Per-run cgroup v2 (cgroup.h). The caller's cgroup is found from /proc/self/cgroup ("0::<path>")
// under the cgroup2 mount of /proc/self/mountinfo. Its children get the memory and pids controllers
// only when its cgroup.subtree_control lists them or accepts "+memory +pids": that fails (EBUSY) when
// the caller's cgroup holds processes and is not the root (cgroup v2's no-internal-process rule). A
// caller alone in its cgroup moves into a leaf of it first; with other processes there (moving them
// would disturb them) it is kRlimit mode.
#include "sandbox/cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/log.h"

namespace dc::sandbox {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool write_text(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int e = errno;
  close(fd);
  errno = e;
  return ok;
}

bool has_word(const std::string& list, const std::string& word) {
  std::istringstream in(list);
  for (std::string w; in >> w;)
    if (w == word) return true;
  return false;
}

// The cgroup2 mount point, or "".
std::string cgroup2_mount() {
  std::ifstream f("/proc/self/mountinfo");
  for (std::string line; std::getline(f, line);) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream in(line);
    std::string id, parent, dev, root, mnt;
    in >> id >> parent >> dev >> root >> mnt;
    return mnt;
  }
  return "";
}

// Whether `base`'s cgroup.procs lists this process only.
bool only_this_process(const std::string& base) {
  std::istringstream in(read_text(base + "/cgroup.procs"));
  int n = 0;
  for (long pid; in >> pid; ++n)
    if (pid != getpid()) return false;
  return n == 1;
}

// Writes "+memory +pids" to base's cgroup.subtree_control. When that fails because this process is
// the only one in `base` (a delegated cgroup, e.g. a systemd unit with Delegate=yes), moves it into a
// leaf of its own first (its limits stay those of `base`, the leaf's parent) and sets `moved`. With
// other processes in `base`, moving them would disturb them: no (errno EBUSY for the caller).
bool enable_controllers(const std::string& base, std::string& moved) {
  const std::string control = base + "/cgroup.subtree_control";
  if (write_text(control, "+memory +pids")) return true;
  if (errno != EBUSY || !only_this_process(base)) return false;
  const std::string leaf = base + "/dc-caller-" + std::to_string(getpid());
  if (mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST) return false;
  if (!write_text(leaf + "/cgroup.procs", std::to_string(getpid()))) {
    rmdir(leaf.c_str());
    errno = EBUSY;
    return false;
  }
  if (write_text(control, "+memory +pids")) {
    moved = leaf;
    return true;
  }
  const int e = errno;
  write_text(base + "/cgroup.procs", std::to_string(getpid()));  // back where it was
  rmdir(leaf.c_str());
  errno = e;
  return false;
}

CgroupSupport decide() {
  CgroupSupport s;
  const char* off = std::getenv("DC_SANDBOX_NO_CGROUP");
  if (off && *off && std::strcmp(off, "0") != 0) {
    s.reason = "DC_SANDBOX_NO_CGROUP is set";
    return s;
  }
  const std::string mnt = cgroup2_mount();
  if (mnt.empty()) {
    s.reason = "no cgroup2 file system is mounted";
    return s;
  }
  std::string rel;
  {
    std::ifstream f("/proc/self/cgroup");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  }
  if (rel.empty()) {
    s.reason = "this process is in no cgroup v2 (/proc/self/cgroup)";
    return s;
  }
  const std::string base = rel == "/" ? mnt : mnt + rel;
  const std::string controllers = read_text(base + "/cgroup.controllers");
  if (!has_word(controllers, "memory") || !has_word(controllers, "pids")) {
    s.reason = "the cgroup v2 " + base + " has no memory and pids controllers (it has: " +
               (controllers.empty() ? std::string("none") : controllers.substr(0, controllers.find('\n'))) +
               "; they are in a cgroup v1 hierarchy or not delegated)";
    return s;
  }
  const std::string subtree = read_text(base + "/cgroup.subtree_control");
  std::string moved;
  const bool enabled = has_word(subtree, "memory") && has_word(subtree, "pids");
  if (!enabled && rel == "/") {  // the hierarchy's root: enabling controllers there changes the whole machine
    s.reason = "this process is in the root cgroup " + base + ", whose children lack memory and pids (enable them "
               "there yourself, or run under a delegated cgroup, e.g. systemd-run --scope -p Delegate=yes)";
    return s;
  }
  if (!enabled && !enable_controllers(base, moved)) {
    s.reason = "cannot enable memory and pids for the children of " + base + ": " + std::strerror(errno) +
               (errno == EBUSY ? " (it holds other processes: cgroup v2's no-internal-process rule)" : "");
    return s;
  }
  // A probe child: can we create one and does it have memory.max?
  const std::string probe = base + "/dc-sandbox-probe-" + std::to_string(getpid());
  if (mkdir(probe.c_str(), 0755) != 0 && errno != EEXIST) {
    s.reason = "cannot create a cgroup under " + base + ": " + std::strerror(errno);
    return s;
  }
  struct stat st;
  const bool has_max = stat((probe + "/memory.max").c_str(), &st) == 0 && stat((probe + "/pids.max").c_str(), &st) == 0;
  rmdir(probe.c_str());
  if (!has_max) {
    s.reason = "a cgroup under " + base + " has no memory.max / pids.max";
    return s;
  }
  s.usable = true;
  s.base = base;
  s.reason = "cgroup v2 under " + base + ": memory.max, memory.swap.max 0, pids.max per run" +
             (moved.empty() ? std::string() : " (this process moved into its leaf " + moved + ")");
  return s;
}

std::atomic<uint32_t> g_cgroup_counter{0};

}  // namespace

const CgroupSupport& cgroup_support() {
  static std::once_flag once;
  static CgroupSupport support;
  std::call_once(once, [] { support = decide(); });
  return support;
}

Status RunCgroup::create(const std::string& base, const Limits& limits) {
  std::string path = base + "/dc-run-" + std::to_string(getpid()) + "-" + std::to_string(g_cgroup_counter.fetch_add(1));
  if (mkdir(path.c_str(), 0755) != 0)
    return io_error("sandbox: cannot create the run's cgroup " + path + ": " + std::strerror(errno));
  path_ = path;
  auto limit = [](int64_t v) { return v > 0 ? std::to_string(v) : std::string("max"); };
  // pids.max counts the init too (and threads, like RLIMIT_NPROC).
  if (!write_text(path + "/memory.max", limit(limits.memory_bytes)) ||
      !write_text(path + "/pids.max", limit(limits.max_processes > 0 ? limits.max_processes + 1 : 0)))
    return io_error("sandbox: cannot set the limits of the cgroup " + path + ": " + std::strerror(errno));
  // No swap (absent where the kernel does not account swap: nothing to limit then).
  if (!write_text(path + "/memory.swap.max", "0") && errno != ENOENT)
    return io_error("sandbox: cannot set memory.swap.max of " + path + ": " + std::strerror(errno));
  return Status::ok_status();
}

Status RunCgroup::attach(long pid) {
  if (!write_text(path_ + "/cgroup.procs", std::to_string(pid)))
    return io_error("sandbox: cannot move the run into its cgroup " + path_ + ": " + std::strerror(errno));
  return Status::ok_status();
}

RunCgroup::Events RunCgroup::events() const {
  Events e;
  if (path_.empty()) return e;
  auto count = [](const std::string& text, const std::string& key) -> long {
    std::istringstream in(text);
    for (std::string k; in >> k;) {
      long v = 0;
      in >> v;
      if (k == key) return v;
    }
    return 0;
  };
  e.oom_killed = count(read_text(path_ + "/memory.events"), "oom_kill") > 0;
  e.pids_max = count(read_text(path_ + "/pids.events"), "max") > 0;
  return e;
}

void RunCgroup::finish() {
  if (path_.empty()) return;
  write_text(path_ + "/cgroup.kill", "1");  // 5.14+; the init's death has killed the rest anyway
  // Processes killed a moment ago may still be exiting: retry briefly (bounded: 2 s).
  bool removed = false;
  for (int i = 0; i < 2000; ++i) {
    if (rmdir(path_.c_str()) == 0 || errno == ENOENT) {
      removed = true;
      break;
    }
    if (errno != EBUSY) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!removed)  // not silent: an empty cgroup left behind costs little, but say so
    log(LogLevel::kError, "sandbox: cannot remove the run's cgroup " + path_ + ": " + std::strerror(errno) +
                              " (rmdir it by hand)");
  path_.clear();
}

}  // namespace dc::sandbox
