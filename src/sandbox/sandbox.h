// The sandbox: runs one untrusted program in a fresh set of Linux namespaces with resource limits, a
// wall-clock timeout that kills its whole process tree, captured (capped) stdout / stderr, a clean
// environment, no inherited descriptors, a system-call filter and a private, size-bounded /tmp that
// disappears with the run. Used by `diffucoder eval` and the GRPO code rewards. Only kernel facilities
// (clone, pivot_root, setrlimit, seccomp through libseccomp, cgroup v2 where delegated); see
// docs/ARCHITECTURE.md "Sandbox" and README "Sandbox" for the design and the refused system calls.
//
// What the program sees: new user, PID, network, IPC, mount and UTS namespaces; `/usr` (and the
// Debian merged-/usr links `/bin`, `/lib`, `/lib64`, `/sbin`) read-only; a few files of `/etc` the
// dynamic loader and Python read (ld.so.cache, localtime, ...), read-only; `/dev/null`, `zero`,
// `random`, `urandom`; its own `/proc`; a writable `/tmp` (its working directory): a tmpfs of
// `Limits::tmp_bytes` inside the run's mount namespace, holding copies of `RunSpec::files`; the
// loopback interface only. It runs as uid / gid 1000 inside, an unprivileged uid outside, with no
// capabilities, PR_SET_NO_NEW_PRIVS and a seccomp filter (refused calls fail with EPERM). The outside
// uid is distinct per concurrent run (so RLIMIT_NPROC counts each run on its own) only when the
// caller is root; a non-root caller maps its own uid, so its concurrent runs share one RLIMIT_NPROC
// count (and the caller's own processes count too). Its PID 1 is a small init of ours that reaps
// every process and reports the program's status; when the program exits (or the caller kills the
// init on timeout / output overflow) the kernel kills every process left in the namespace.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace dc::sandbox {

// Resource limits of one run. 0 means "no limit" for every field except the wall clock.
struct Limits {
  double wall_seconds = 10.0;               // killed (with every process it started) past this; (0, 1e6]
  double cpu_seconds = 10.0;                // RLIMIT_CPU (soft; hard = soft + 1 s): SIGXCPU / SIGKILL; [0, 1e6]
  int64_t address_space_bytes = 1ll << 30;  // RLIMIT_AS (virtual memory of each process)
  int64_t max_processes = 64;               // RLIMIT_NPROC (processes + threads of the run's uid)
  // The whole run's memory. With a cgroup v2 (memory_mode() == kCgroup): memory.max of the run's own
  // cgroup (swap 0, pids.max = max_processes). Without: RLIMIT_AS and RLIMIT_NPROC are lowered so that
  // processes x address space <= memory_bytes (effective_limits()).
  int64_t memory_bytes = 1ll << 30;
  int64_t file_size_bytes = 64ll << 20;     // RLIMIT_FSIZE (largest file it may write)
  int64_t open_files = 64;                  // RLIMIT_NOFILE
  int64_t output_bytes = 1ll << 20;         // stdout and stderr each; killed when exceeded
  int64_t tmpfs_bytes = 64ll << 20;         // size of the tmpfs holding the new root's (read-only) skeleton
  // Size of the run's writable /tmp (a tmpfs: RunSpec::files plus all the program writes; ENOSPC past
  // it, LimitHit::kDisk). 0: the kernel's tmpfs default, half the RAM: do not, for untrusted code.
  int64_t tmp_bytes = 64ll << 20;
};

// One program to run.
struct RunSpec {
  std::vector<std::string> argv;                 // argv[0] is looked up in /usr/bin if not absolute
  std::string stdin_data;                        // fed to its stdin (empty: /dev/null)
  std::map<std::string, std::string> files;      // name (relative, no "..") → contents, in /tmp
  std::map<std::string, std::string> env;        // added to the clean environment (PATH, HOME, LANG)
  Limits limits;
};

// Which limit ended the run, if any.
enum class LimitHit {
  kNone,
  kWallTime,    // the wall-clock timeout (RunResult::timed_out)
  kCpuTime,     // RLIMIT_CPU
  kOutput,      // stdout or stderr passed Limits::output_bytes
  kFileSize,    // RLIMIT_FSIZE (SIGXFSZ, or EFBIG reported by the program)
  kMemory,      // RLIMIT_AS (MemoryError / "Cannot allocate memory" reported by the program), or the
                // run's cgroup memory.max (the kernel's OOM killer killed a process of the run)
  kProcesses,   // RLIMIT_NPROC (fork failed: EAGAIN reported by the program)
  kOpenFiles,   // RLIMIT_NOFILE (EMFILE reported by the program)
  kDisk,        // Limits::tmp_bytes: /tmp is full (ENOSPC, "No space left on device" reported by the program)
};
const char* limit_hit_name(LimitHit hit);

// What happened. A program that could not be started at all (bad argv[0]) is an ordinary result with
// exit_code 127 and the reason on stderr; only a failure of the sandbox itself (namespaces refused,
// temp dir not creatable) is an error Status.
struct RunResult {
  bool exited = false;      // ended by exit(); exit_code is valid
  int exit_code = -1;
  int signal = 0;           // ended by this signal (0 if it exited)
  bool timed_out = false;   // killed at Limits::wall_seconds
  LimitHit limit = LimitHit::kNone;
  std::string stdout_data, stderr_data;  // at most Limits::output_bytes each
  bool stdout_truncated = false, stderr_truncated = false;
  double wall_seconds = 0;  // clone to the init's exit
  double cpu_seconds = 0;   // user + system of every process of the run that was reaped
  int64_t max_rss_bytes = 0;  // largest resident set of one process of the run
  // Empty, or why the run's host temp dir could not be removed (the path, the error, what to do); the
  // run's result is valid either way, and the same text went to stderr.
  std::string cleanup_error;

  bool ok() const { return exited && exit_code == 0 && limit == LimitHit::kNone; }
};

// Runs `spec` in a new sandbox and waits for it. Thread-safe: any number of runs may be in flight
// from different threads (SandboxPool does that).
Result<RunResult> run(const RunSpec& spec);

// Whether this machine lets us create the namespaces (user namespaces enabled) and install the
// seccomp filter; the message says why not. Tests skip when it is not ok.
Status check_available();

// How a run's memory is bounded on this machine (decided once per process, on first use):
// kCgroup: each run gets its own cgroup v2 under the caller's (memory.max, memory.swap.max 0,
// pids.max), removed after the run (a caller alone in its cgroup is moved into a leaf of it first);
// kRlimit: no usable cgroup v2 (none, no memory / pids controller, or the caller's cgroup holds
// other processes: cgroup v2's no-internal-process rule), so the per-process limits are lowered
// instead (effective_limits()). DC_SANDBOX_NO_CGROUP=1 forces kRlimit.
enum class MemoryMode { kCgroup, kRlimit };
MemoryMode memory_mode();

// One line for a command's start message: the memory mode and why, e.g. "sandbox: memory per run:
// cgroup v2 under /sys/fs/cgroup/x: memory.max, memory.swap.max 0, pids.max per run" or "sandbox:
// memory per run: no usable cgroup v2 (...); per-process RLIMIT_AS and RLIMIT_NPROC lowered so that
// processes x address space <= the run's memory". Thread-safe.
std::string describe();

// The limits a run of `limits` really gets in the current memory_mode(): unchanged under kCgroup;
// under kRlimit (when memory_bytes > 0) address_space_bytes = min(address_space_bytes,
// max(kMinProcessBytes, memory_bytes / max_processes)) and max_processes = min(max_processes,
// memory_bytes / address_space_bytes) (at least 1), so processes x address space <= memory_bytes.
inline constexpr int64_t kMinProcessBytes = 64ll << 20;  // python3 starts in ~16 MiB, +8 MiB a thread
Limits effective_limits(const Limits& limits);

}  // namespace dc::sandbox
