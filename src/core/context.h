// Context: what every op needs besides its tensors (device, thread pool, scratch). Passed explicitly; no
// globals.
#pragma once

#include "core/thread_pool.h"
#include "core/workspace.h"

namespace dc {

class Profiler;       // core/profiler.h
class DeviceBackend;  // ops/device.h: an opened device (Vulkan), its weights and memory

// Where an op's operands live and its kernels run. kVulkan: the activations are device pointers of the
// context's DeviceBackend (not host-dereferenceable), the weights the host views uploaded to it.
enum class Device { kCpu, kVulkan };

// What the fast CPU matmul feeds to bf16 weights. kF32: activations stay f32 (weights widened to f32,
// f32 FMA): the reference kernels' results up to summation order. kBF16: activations rounded to bf16
// once per call, bf16 dot products with f32 accumulation: about 2x faster, ~3e-3 relative error on the
// logits. Matmuls over f16 and f32 weights, and attention, always compute in f32.
enum class MatmulPrecision { kF32, kBF16 };

struct Context {
  Device device = Device::kCpu;
  ThreadPool* pool = nullptr;  // not owned; must outlive every op call made with this context
  bool reference_kernels = false;  // true: the plain reference kernels (the fast kernels' test oracle)
  MatmulPrecision matmul_precision = MatmulPrecision::kF32;
  // Scratch of the forward's activations, the matmul backward's temporaries and the CPU kernels'
  // per-thread block buffers (not owned). Null: each call allocates its own and frees it on return
  // (correct, but pays the allocation every call). One call at a time per workspace: concurrent calls
  // need a Context each (Engine::logits_fn gives every generation its own).
  Workspace* workspace = nullptr;
  // Phase timers (core/profiler.h; not owned), null = off: the ops' ProfileScopes then cost a branch.
  Profiler* profiler = nullptr;
  // The device of Device::kVulkan (not owned; null on the CPU). One forward at a time records into it
  // (DeviceBackend::lock, held by Model::forward).
  DeviceBackend* backend = nullptr;
};

}  // namespace dc
