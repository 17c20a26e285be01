// The sandbox's child side (internal to src/sandbox): the plan the caller builds before the clone, and
// the run's init that carries it out. The child is a raw clone of a possibly multithreaded caller, so
// from the clone to the program's execve it touches no lock and no allocator: only system calls on
// memory the plan already holds.
#pragma once

#include <linux/filter.h>

#include <string>
#include <utility>
#include <vector>

#include "sandbox/sandbox.h"

namespace dc::sandbox {

inline constexpr int kInsideId = 1000;  // uid and gid of the program inside its user namespace

// Everything the child needs, built before the clone, in ordinary (std::allocator) memory: never in
// core/pages.h's buffers, which the clone does not carry (MADV_DONTFORK).
struct ChildPlan {
  std::string dir;                                     // the run's host temp dir
  std::string root, stage;                             // relative to `dir`: the new root, the staged files
  std::vector<std::string> bind_dirs;                  // "/usr", or "/lib" where it is no symlink
  std::vector<unsigned long> bind_dir_flags;           // the source mount's locked flags
  std::vector<std::pair<std::string, std::string>> links;  // name → target, e.g. bin → usr/bin
  std::vector<std::string> etc_files, dev_files;       // bound read-only / as they are
  std::string tmpfs_opts;                              // the root skeleton's tmpfs
  std::string tmp_opts;                                // the writable /tmp's tmpfs (its size)
  std::vector<std::string> stage_files, tmp_files;     // RunSpec::files: staged copy → copy in /tmp
  bool clear_groups = false;                           // drop supplementary groups (root callers)
  std::string exe;                                     // resolved argv[0]
  std::vector<std::string> argv_s, env_s;
  std::vector<char*> argv, envp;
  Limits limits;                                       // effective_limits() of the spec's
  sock_fprog filter{};                                 // the seccomp program (seccomp_filter.h)
  // Paths inside the new root, relative to `dir`, in the order child_init walks them (mount_root()).
  std::vector<std::string> root_paths;
};

// The run's PID 1. fds: 0 stdin, 1 stdout, 2 stderr, 3 the status pipe (the report: 'S' + the
// program's wait status, or 'E' + why the sandbox could not start), 4 the sync pipe (one byte once the
// caller wrote the uid / gid maps and put us in the run's cgroup).
[[noreturn]] void child_init(const ChildPlan& plan);

}  // namespace dc::sandbox
