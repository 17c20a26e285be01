// Removing a run's host temp dir (internal to src/sandbox, exposed for its tests): the way `rm -rf`
// does it, by file descriptor (openat / fdopendir / unlinkat), so no path ever grows past PATH_MAX.
#pragma once

#include <string>

#include "core/status.h"

namespace dc::sandbox {

// Removes `dir` and everything under it, however deep: never follows a symbolic link (one is removed
// as a link), makes directories a program closed (mode 000) traversable first, holds two descriptors
// at most (it climbs back through ".."; the names on the way down are kept in memory). ok if `dir` is
// gone afterwards (or was never there); otherwise an error naming the entry that could not be removed
// and why. Not for trees that other processes are changing at the same time.
Status remove_tree(const std::string& dir);

}  // namespace dc::sandbox
