// The sandbox's system-call filter (internal to src/sandbox): a seccomp BPF program built once per
// process with libseccomp, before any clone (the child may not allocate), and installed by the
// program's process right before execve. The list of refused calls and why: README "Sandbox".
#pragma once

#include <linux/filter.h>

#include "core/status.h"

namespace dc::sandbox {

// The filter as a ready sock_fprog (pointing into a buffer that lives as long as the process), built on
// the first call (thread-safe); an error if libseccomp cannot build or export it.
Result<sock_fprog> seccomp_program();

}  // namespace dc::sandbox
