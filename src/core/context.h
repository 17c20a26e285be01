// Context: what every op needs besides its tensors (device, thread pool). Passed explicitly; no globals.
#pragma once

#include "core/thread_pool.h"

namespace dc {

enum class Device { kCpu };

struct Context {
  Device device = Device::kCpu;
  ThreadPool* pool = nullptr;  // not owned; must outlive every op call made with this context
};

}  // namespace dc
