// Devices under the one forward: the CPU (operands in host memory) or a DeviceBackend — the Vulkan
// backend today — whose activations are device pointers: addresses in the backend's memory, never
// dereferenced by the host, with pointer arithmetic reserved for a later step (an operand that is not the
// start of one of the backend's buffers is an error of the forward, not undefined behaviour). The ops' front-ends switch on Context::device and
// call the backend's op exactly as they call the CPU kernels; the helpers below are how the forward
// (model/transformer.cc) gets its buffers and host inputs on either device.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/context.h"
#include "core/status.h"
#include "ops/attention.h"
#include "ops/head_sampler.h"
#include "ops/weight.h"

namespace dc {

// What --device names: the CPU, or Vulkan device `index` (vulkan:N, `diffucoder devices` lists them).
struct DeviceSpec {
  Device device = Device::kCpu;
  int index = 0;
};
// "cpu", "vulkan" (device 0) or "vulkan:N". Errors (kInvalidArgument) name --device's accepted forms.
Result<DeviceSpec> parse_device(std::string_view spec);

// Device memory that outlives one forward (a KV cache), from DeviceBackend::allocate: freed when destroyed,
// which must happen before the backend is (any thread; the memory is released at the next forward).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual float* data() const = 0;  // its device pointer
};

// The host-side work a backend did since it was opened (ops/vulkan/runtime.h Counters): the cost of a forward
// that does not depend on the device's speed. bench --device prints it per step.
struct DeviceCounters {
  int64_t runs = 0;                 // finish() calls that ran work
  int64_t recordings = 0;           // command buffers recorded
  int64_t dispatches_recorded = 0;  // dispatches recorded into them
  int64_t descriptor_sets = 0;      // descriptor sets allocated
  int64_t submits = 0;              // queue submissions (runs, uploads, downloads)
  int64_t uploads = 0;              // host-to-device copies
  int64_t upload_bytes = 0;
  int64_t downloads = 0;
  double record_ms = 0;             // host time spent recording
  int64_t dispatches_run = 0;       // dispatches submitted (recorded or replayed)
  double collect_ms = 0;            // host CPU time from begin() to the run: the ops collecting their commands
};

// An opened compute device: its copy of the weights, the forward's device memory, and the ops of the
// inference forward over device pointers. One forward at a time records into it (lock()); begin() starts
// recording, the ops record their kernels (an error is kept and the later ops are skipped), finish() runs
// what was recorded and returns the first error. Weights are named by their host views: an op given a
// WeightView, a norm weight or a bias uses the device copy made by add_matrix / add_vector.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual std::string name() const = 0;        // e.g. "vulkan:0 (llvmpipe (LLVM 15.0.6, 256 bits))"
  virtual int64_t memory_bytes() const = 0;    // the device-local heap
  virtual int64_t weight_bytes() const = 0;    // what add_matrix / add_vector uploaded
  virtual DeviceCounters counters() const = 0;
  // Whether the GEMMs may use the device's matrix units, which round the activations to f16 (the device's
  // form of MatmulPrecision::kBF16; off: exact f32 arithmetic), and the arithmetic that gives, for notes
  // and benchmarks: "f32" or "f16 matrix units, f32 accumulation, for bf16 / f16 weights (f32 for the rest)"
  // (the matrix units take bf16 and f16 weights with columns a multiple of 64, over more than 8 rows).
  virtual void set_matrix_units(bool allowed) = 0;
  virtual std::string arithmetic() const = 0;

  // Upload a weight once (a second call with the same host data is a no-op: tied embeddings). Errors:
  // a CPU-only layout (kPanels), out of device memory (kResourceExhausted), naming `name`.
  virtual Status add_matrix(const WeightView& w, const std::string& name) = 0;
  virtual Status add_vector(const float* v, int64_t n, const std::string& name) = 0;
  // Ok when the device's attention takes head_dim (checked at upload; the error names head_dim and why).
  virtual Status check_head_dim(int64_t head_dim) const = 0;
  // `bytes` of device memory of the caller's (not reused by later forwards), named `what` in errors
  // (kResourceExhausted when the device has too little). Called inside a forward (lock() held).
  virtual Result<std::unique_ptr<DeviceMemory>> allocate(int64_t bytes, const std::string& what) = 0;

  virtual std::unique_lock<std::mutex> lock() = 0;
  virtual Status begin() = 0;
  // `bytes` of device memory named `name` (grown, never shrunk, reused by the next forward); nullptr after
  // an error (which finish() returns).
  virtual void* alloc(const char* name, int64_t bytes) = 0;
  // alloc(name, bytes) holding a copy of host[bytes], made now (before finish() runs the kernels).
  virtual const void* copy_in(const char* name, const void* host, int64_t bytes) = 0;
  virtual Status status() const = 0;  // the first error since begin()
  virtual Status finish() = 0;
  // Copies device[bytes] to host[bytes] as part of the work finish() runs (no submission or wait of its own):
  // `host` holds it once finish() has returned ok, and must stay valid until then. `name` names the
  // persistent staging memory it goes through (grown, never shrunk).
  virtual void copy_out(const char* name, const void* device, void* host, int64_t bytes) = 0;

  // The ops of ops/matmul.h, ops/elementwise.h, ops/attention.h and ops/attention_window.h with device
  // pointers (attention: the window [window_begin, window_begin + window_len) of queries; the full attention
  // is the window [0, n_seq)).
  virtual void matmul_nt(const float* x, int64_t n, const WeightView& w, const float* bias, float* y) = 0;
  virtual void rms_norm(const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) = 0;
  virtual void rope_apply(float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                          const float* sin) = 0;
  virtual void swiglu(const float* gate, const float* up, int64_t count, float* out) = 0;
  virtual void add_inplace(float* y, const float* x, int64_t count) = 0;
  virtual void embedding(const WeightView& table, const int32_t* ids, int64_t n, float* out) = 0;
  virtual void gather_rows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out) = 0;
  virtual void attention(const AttentionShape& shape, int64_t window_begin, int64_t window_len, const float* q,
                         const float* k, const float* v, const uint8_t* valid, float* out) = 0;
  virtual void kv_store(const float* src, int64_t n_batch, int64_t n_seq, int64_t window_begin, int64_t window_len,
                        int64_t cols, float* cache) = 0;
  // The head sampler's step (engine/device_head_sampler.h) per row of logits[n, n_vocab] with `filter`:
  // ids[n] the token (the argmax, lowest id on ties, at temperature 0; else the categorical draw of
  // uniforms[n], f32 in [0, 1), in sampler/filters.h's order) and conf[n, 3] of the filtered softmax: the
  // token's probability, the top-1 − top-2 margin and Σ p·log(p + 1e-10) (NaN for a row with a NaN or +inf
  // logit or every logit −inf), sampler/filters.h's rules throughout.
  virtual void sample_rows(const float* logits, int64_t n, int64_t n_vocab, const FilterConfig& filter,
                           const float* uniforms, int32_t* ids, float* conf) = 0;
};

// Opens Vulkan device `index` (ops/vulkan/runtime.h's order). Errors: kUnimplemented (built without
// Vulkan), kNotFound (no loader, driver or device), kOutOfRange (no such index, listing the devices).
Result<std::unique_ptr<DeviceBackend>> open_vulkan_backend(int index);

// n floats of the forward named `name`: ctx.workspace's on the CPU (which must be set), the backend's
// device memory on a device (nullptr after a device error).
float* device_floats(const Context& ctx, const char* name, int64_t n);

// The device's first error of this forward (ok on the CPU): check it after the allocations, before the ops,
// which need non-null operands.
Status device_status(const Context& ctx);

// host[n] where ctx's ops read it: the host pointer itself on the CPU, a device copy named `name` on a
// device (nullptr stays nullptr).
template <typename T>
const T* device_copy(const Context& ctx, const char* name, const T* host, int64_t n) {
  if (ctx.device == Device::kCpu || host == nullptr) return host;
  return static_cast<const T*>(ctx.backend->copy_in(name, host, n * static_cast<int64_t>(sizeof(T))));
}

}  // namespace dc
