// SandboxPool: runs many sandboxed programs, N at once. Each run is independent (its own
// namespaces, temp dir and limits); the pool only bounds how many are in flight.
#pragma once

#include <functional>
#include <vector>

#include "sandbox/sandbox.h"

namespace dc::sandbox {

// Called (from a worker thread, one call at a time) as each run finishes: its index in `specs` and
// its result.
using OnRunDone = std::function<void(size_t index, const Result<RunResult>& result)>;

// Runs every spec with at most `workers` (≥ 1) in flight; returns the results in the order of
// `specs`. Blocks until all are done.
std::vector<Result<RunResult>> run_all(const std::vector<RunSpec>& specs, int workers,
                                       const OnRunDone& on_done = nullptr);

}  // namespace dc::sandbox
