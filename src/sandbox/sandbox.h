// The sandbox: runs one untrusted program in a fresh set of Linux namespaces with resource limits, a
// wall-clock timeout that kills its whole process tree, captured (capped) stdout / stderr, a clean
// environment, no inherited descriptors and a private writable temp dir that is deleted afterwards.
// Used by `diffucoder eval` and, later, by the training rewards. Only kernel facilities are used
// (clone / unshare, pivot_root, setrlimit); see docs/ARCHITECTURE.md "Sandbox" for the design.
//
// What the program sees: new user, PID, network, IPC, mount and UTS namespaces; `/usr` (and the
// Debian merged-/usr links `/bin`, `/lib`, `/lib64`, `/sbin`) read-only; a few files of `/etc` the
// dynamic loader and Python read (ld.so.cache, localtime, ...), read-only; `/dev/null`, `zero`,
// `random`, `urandom`; its own `/proc`; a writable `/tmp` (its working directory, holding
// `RunSpec::files`); the loopback interface only. It runs as uid / gid 1000 inside, an unprivileged
// uid outside (a distinct one per concurrent run, so RLIMIT_NPROC counts each run on its own), with
// no capabilities and PR_SET_NO_NEW_PRIVS. Its PID 1 is a small init of ours that reaps every
// process and reports the program's status; when the program exits (or the caller kills the init on
// timeout / output overflow) the kernel kills every process left in the namespace.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace dc::sandbox {

// Resource limits of one run. 0 means "no limit" for every field except the wall clock.
struct Limits {
  double wall_seconds = 10.0;               // killed (with every process it started) past this
  double cpu_seconds = 10.0;                // RLIMIT_CPU (soft; hard = soft + 1 s): SIGXCPU / SIGKILL
  int64_t address_space_bytes = 1ll << 30;  // RLIMIT_AS (virtual memory of each process)
  int64_t max_processes = 64;               // RLIMIT_NPROC (processes + threads of the run's uid)
  int64_t file_size_bytes = 64ll << 20;     // RLIMIT_FSIZE (largest file it may write)
  int64_t open_files = 64;                  // RLIMIT_NOFILE
  int64_t output_bytes = 1ll << 20;         // stdout and stderr each; killed when exceeded
  int64_t tmpfs_bytes = 64ll << 20;         // size of the tmpfs holding the new root's skeleton
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
  kMemory,      // RLIMIT_AS (MemoryError / "Cannot allocate memory" reported by the program)
  kProcesses,   // RLIMIT_NPROC (fork failed: EAGAIN reported by the program)
  kOpenFiles,   // RLIMIT_NOFILE (EMFILE reported by the program)
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

  bool ok() const { return exited && exit_code == 0 && limit == LimitHit::kNone; }
};

// Runs `spec` in a new sandbox and waits for it. Thread-safe: any number of runs may be in flight
// from different threads (SandboxPool does that).
Result<RunResult> run(const RunSpec& spec);

// Whether this machine lets us create the namespaces (user namespaces enabled); the message says
// why not. Tests skip when it is not ok.
Status check_available();

}  // namespace dc::sandbox
