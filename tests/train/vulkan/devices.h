// The device trainer tests' two contexts (grpo_vulkan_test.cc, trainer_vulkan_test.cc): the CPU's reference kernels
// and device 0 (lavapipe in CI), on one pool; `backend` is null when the device cannot be opened (a failure).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "core/context.h"
#include "core/thread_pool.h"
#include "ops/device.h"

namespace dc::train {

struct Devices {
  ThreadPool pool{2};
  std::unique_ptr<DeviceBackend> backend;
  Context cpu, dev;
  Devices() {
    cpu.pool = &pool, cpu.reference_kernels = true;
    auto opened = open_vulkan_backend(0);
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
    if (!opened.ok()) return;
    backend = std::move(*opened);
    dev.pool = &pool, dev.device = Device::kVulkan, dev.backend = backend.get();
  }
};

}  // namespace dc::train
