// The loss batches of the device model training tests (backward_vulkan_test.cc, lora_vulkan_test.cc): a
// left-padded batch with loss rows, its loss and dlogits on the CPU, host data copied to the device, and a device
// context holding a model's weights.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "ops/loss.h"
#include "batch_case.h"

namespace dc {

// left_padded's batch with a loss row at every third of its rows plus the last once more (rows may repeat),
// random targets and weights.
struct TrainBatch {
  BatchCase batch;
  std::vector<int32_t> targets;
  std::vector<float> weights;
  ForwardBatch view() const { return batch.view(); }
};

inline TrainBatch make_train_batch(int64_t B, int64_t L, int64_t n_vocab, uint64_t seed) {
  TrainBatch k;
  k.batch = left_padded(B, L, n_vocab, static_cast<uint32_t>(seed));
  std::vector<int64_t> rows;
  for (size_t i = 0; i < k.batch.rows.size(); i += 3) rows.push_back(k.batch.rows[i]);
  rows.push_back(rows.back());
  k.batch.rows = rows;
  uint64_t state = seed;
  for (size_t i = 0; i < rows.size(); ++i) {
    k.targets.push_back(static_cast<int32_t>(splitmix64_next(state) % static_cast<uint64_t>(n_vocab)));
    k.weights.push_back(0.25f + static_cast<float>(splitmix64_next(state) % 1000) / 1000.0f);
  }
  return k;
}

// Device 0 of a fresh backend (owned by *backend) as a context on `pool`, with `model`'s weights uploaded; *backend
// stays null when the device cannot be opened (a failure).
inline Context device_with_weights(const Model& model, ThreadPool* pool, std::unique_ptr<DeviceBackend>* backend) {
  Context dev{Device::kVulkan, pool};
  auto opened = open_vulkan_backend(0);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  if (!opened.ok()) return dev;
  *backend = std::move(*opened);
  dev.backend = backend->get();
  EXPECT_TRUE(model.to_device(dev).ok());
  return dev;
}

// The device's copy of host[n] (a named buffer of the backend: it stays until the next copy of that name).
inline const float* upload_floats(DeviceBackend& backend, const char* name, const std::vector<float>& host) {
  const std::unique_lock<std::mutex> lock = backend.lock();
  EXPECT_TRUE(backend.begin().ok());
  const DevicePtr<void> p = backend.copy_in(name, host.data(), static_cast<int64_t>(host.size() * sizeof(float)));
  const Status s = backend.finish();
  EXPECT_TRUE(s.ok()) << s.to_string();
  return as_operand(device_cast<const float>(p));
}

inline double l2_norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

// The loss rows' weighted cross-entropy of host logits (overwritten with dlogits) on the CPU.
inline double loss_and_dlogits(const TrainBatch& k, int64_t V, std::vector<float>& logits) {
  Context cpu;
  cpu.reference_kernels = true;
  const int64_t n = static_cast<int64_t>(k.batch.rows.size());
  return cross_entropy(cpu, logits.data(), k.targets.data(), k.weights.data(), n, V, logits.data());
}

}  // namespace dc
