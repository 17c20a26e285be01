// What `diffucoder bench` measures inside the facade's objects, kept below the public API on purpose
// (docs/ARCHITECTURE.md, "bench over the facade"): a device's counters, the thread pool the GEMM peaks are
// measured on, and generations and a Trainer whose ops time themselves into a Profiler (bench's breakdown of a
// step, bench --train --profile).
#pragma once

#include <diffucoder/diffucoder.h>

#include <memory>

#include "core/profiler.h"
#include "core/thread_pool.h"
#include "ops/device.h"

namespace dc::api {

// The device `model` computes on (its counters, weight bytes and arithmetic); null on the CPU.
const DeviceBackend* device_backend(const diffucoder::Model& model);
// The threads `model` computes with.
ThreadPool& thread_pool(const diffucoder::Model& model);

// Times the ops of `model`'s later generate() calls into *profiler (null: off again; it must outlive them):
// bench's breakdown of a step. While one is set, generate from one thread at a time.
void set_profiler(const diffucoder::Model& model, Profiler* profiler);

// Trainer::create with every op of the steps timed into *profiler (null: none, as Trainer::create), which
// must outlive the trainer. Errors as Trainer::create's.
diffucoder::Result<std::unique_ptr<diffucoder::Trainer>> create_trainer(const diffucoder::TrainConfig& config,
                                                                        Profiler* profiler);

}  // namespace dc::api
