// A synthetic model twice, from one config and seed: on the CPU (its context on the reference kernels) and
// uploaded to Vulkan device 0 (lavapipe in CI), for the device tests that compare the two.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "core/context.h"
#include "core/thread_pool.h"
#include "model/synthetic.h"
#include "model/transformer.h"
#include "ops/device.h"

namespace dc::testing {

struct SyntheticPair {
  ThreadPool pool{2};
  std::unique_ptr<DeviceBackend> backend;  // declared first: the models' device memory goes before it
  std::unique_ptr<Model> cpu_model, device_model;
  Context cpu{Device::kCpu, &pool}, device{Device::kVulkan, &pool};
};

// Null (with a test failure naming why) when the device or the upload fails.
inline std::unique_ptr<SyntheticPair> synthetic_pair(const ModelConfig& c, uint64_t seed) {
  auto p = std::make_unique<SyntheticPair>();
  auto backend = open_vulkan_backend(0);
  if (!backend.ok()) {
    ADD_FAILURE() << backend.status().to_string();
    return nullptr;
  }
  p->backend = std::move(backend).value();
  p->device.backend = p->backend.get();
  p->cpu.reference_kernels = true;
  p->cpu_model = make_synthetic_model(c, seed, &p->pool).value();
  p->device_model = make_synthetic_model(c, seed, &p->pool).value();
  const Status up = p->device_model->to_device(p->device);
  if (!up.ok()) {
    ADD_FAILURE() << up.to_string();
    return nullptr;
  }
  return p;
}

}  // namespace dc::testing
