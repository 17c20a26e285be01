// Per-run cgroup v2 (internal to src/sandbox): where the caller's cgroup can have children with the
// memory and pids controllers, each run gets one (memory.max, memory.swap.max 0, pids.max), killed and
// removed after the run. Where not, sandbox::memory_mode() is kRlimit and none of this is used.
#pragma once

#include <string>

#include "core/status.h"
#include "sandbox/sandbox.h"

namespace dc::sandbox {

// The decision, made once per process (thread-safe): usable, the cgroup dir runs go under, and a
// sentence saying why (for describe()).
struct CgroupSupport {
  bool usable = false;
  std::string base;    // e.g. /sys/fs/cgroup/system.slice/x.service
  std::string reason;  // why usable or not
};
const CgroupSupport& cgroup_support();

// One run's cgroup. create() makes it and writes its limits; attach() moves a process in (the run's
// init, before it does anything); finish() reads whether its memory or pids limit was hit, kills
// what is left (cgroup.kill) and removes it.
class RunCgroup {
 public:
  RunCgroup() = default;
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;
  ~RunCgroup() { finish(); }

  Status create(const std::string& base, const Limits& limits);
  Status attach(long pid);
  // After the run: whether the OOM killer killed a process of it / a fork was refused at pids.max.
  struct Events {
    bool oom_killed = false, pids_max = false;
  };
  Events events() const;
  void finish();

 private:
  std::string path_;
};

}  // namespace dc::sandbox
