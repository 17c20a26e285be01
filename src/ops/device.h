// Devices under the one forward: the CPU (operands in host memory) or a DeviceBackend — the Vulkan
// backend today — whose memory is named by DevicePtr, a handle of its own type that the host cannot
// dereference (no *, ->, [] or arithmetic, no conversion to or from a host pointer: such code does not
// compile). An operand the forward offset by rows (a part's rows in a forward of parts, a request's rows in a
// merged step's sampling, a chunk of a trainer's loss rows) carries the offset in its handle; only the per-part ops
// (rope_kv, attention, sample_rows) and copy take one, for every other op an operand that is not the start of one
// of the backend's buffers is an error of the forward, not undefined behaviour. The ops'
// front-ends switch on Context::device and call the backend's op exactly as they call the CPU kernels; the
// helpers below are how the forward (model/transformer.cc) gets its buffers and host inputs on either device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/context.h"
#include "core/status.h"
#include "ops/adamw.h"
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
// The device of the rank with index `local_rank` on its host (training under mpirun, one device per rank):
// "cpu"; "vulkan": device `local_rank` (device 0 in one process); "vulkan:N": device N on every rank (several
// ranks may share it); "vulkan:A,B,...": the local_rank-th index of the list. Errors (kInvalidArgument) name
// --device and, for a list without an entry for this rank, the local rank.
Result<DeviceSpec> parse_rank_device(std::string_view spec, int local_rank);

// The address of device memory holding T's: a DeviceBackend's handle (the Vulkan backend's: a buffer's
// slot), never a host pointer. Null by default; DevicePtr<T> converts to DevicePtr<const T> (and to
// const void / void as T* would); device_cast reinterprets the element type. Nothing else: the host
// reads and writes device memory only through the backend (copy_in, copy_out).
template <typename T>
class DevicePtr {
 public:
  constexpr DevicePtr() = default;
  constexpr DevicePtr(std::nullptr_t) {}  // NOLINT: a null device pointer, as nullptr for T*
  template <typename U>
    requires(!std::is_same_v<U, T> && std::is_convertible_v<U*, T*>)
  constexpr DevicePtr(DevicePtr<U> p) : handle_(p.handle()) {}  // NOLINT: float → const float, as T* does
  // The pointer a backend hands out for its memory `handle` (0: null), and back.
  static constexpr DevicePtr from_handle(uint64_t handle) {
    DevicePtr p;
    p.handle_ = handle;
    return p;
  }
  constexpr uint64_t handle() const { return handle_; }
  constexpr explicit operator bool() const { return handle_ != 0; }
  friend constexpr bool operator==(DevicePtr a, DevicePtr b) { return a.handle_ == b.handle_; }

 private:
  uint64_t handle_ = 0;
};

using DeviceIn = DevicePtr<const float>;  // an op's f32 operand on a device
using DeviceOut = DevicePtr<float>;       // an op's f32 result (or operand updated in place) on a device

// The same device memory seen as U's (a buffer's bytes are untyped; the device's reinterpret_cast).
template <typename U, typename T>
constexpr DevicePtr<U> device_cast(DevicePtr<T> p) {
  return DevicePtr<U>::from_handle(p.handle());
}

// The forward (model/transformer.cc) and the ops' front-ends are written once over T* operands, host
// memory on the CPU. On a device an operand carries a DevicePtr's handle instead, converted only by these
// two: device_floats / device_copy / a device KV cache make such operands (as_operand), the front-ends'
// device case takes them back (as_device) to call the backend, which refuses any handle that is not one of
// its buffers. The forward never dereferences an operand on a device (it runs no host code on them there).
template <typename T>
T* as_operand(DevicePtr<T> p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p.handle()));
}
template <typename T>
DevicePtr<T> as_device(T* operand) {
  return DevicePtr<T>::from_handle(reinterpret_cast<uintptr_t>(operand));
}

namespace device_ptr_checks {  // what makes a host dereference of device memory fail to compile
template <typename P>
concept Dereferenceable = requires(P p) { *p; };
template <typename P>
concept Indexable = requires(P p) { p[0]; };
template <typename P>
concept Offsettable = requires(P p) { p + 1; };
static_assert(!Dereferenceable<DevicePtr<float>> && !Dereferenceable<DevicePtr<const float>>);
static_assert(!Indexable<DevicePtr<float>> && !Offsettable<DevicePtr<float>>);
static_assert(!std::is_convertible_v<DevicePtr<float>, float*> && !std::is_convertible_v<DevicePtr<float>, const float*>);
static_assert(!std::is_constructible_v<float*, DevicePtr<float>> && !std::is_constructible_v<const void*, DevicePtr<float>>);
static_assert(!std::is_convertible_v<float*, DevicePtr<float>> && !std::is_constructible_v<DevicePtr<float>, float*>);
static_assert(std::is_convertible_v<DevicePtr<float>, DevicePtr<const float>>);
static_assert(!std::is_convertible_v<DevicePtr<const float>, DevicePtr<float>>);  // const stays const
static_assert(!std::is_convertible_v<DevicePtr<int32_t>, DevicePtr<float>>);      // device_cast says so
}  // namespace device_ptr_checks

// Device memory that outlives one forward (a KV cache), from DeviceBackend::allocate: freed when destroyed,
// which must happen before the backend is (any thread; the memory is released at the next forward).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual DevicePtr<float> data() const = 0;
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
  int64_t device_bytes = 0;         // device memory held now (the backend's buffers; not the transfers' staging)
  int64_t device_peak_bytes = 0;    // the most it has been since the backend was opened
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
  // The device copy of an uploaded f32 weight (a dense f32 add_matrix, or add_vector), named by its host data
  // pointer, as a writable device operand: what a device optimizer updates in place, and every later op reads.
  // Errors: never uploaded, or stored in another dtype (kInvalidArgument, naming `name`).
  virtual Result<DevicePtr<float>> weight_memory(const void* host, const std::string& name) = 0;
  // Forgets and frees the copy add_matrix / add_vector made from `host` (nothing when there is none), and its
  // weight_memory operand: what the owner of a model's weights does when their host memory may be given back,
  // so that a later upload from the same address (reused by the allocator) is not taken for the old one.
  // Inside lock(), between forwards.
  virtual void drop_weight(const void* host) = 0;
  // `bytes` of device memory of the caller's (not reused by later forwards), named `what` in errors
  // (kResourceExhausted when the device has too little). Called inside a forward (lock() held).
  virtual Result<std::unique_ptr<DeviceMemory>> allocate(int64_t bytes, const std::string& what) = 0;

  virtual std::unique_lock<std::mutex> lock() = 0;
  virtual Status begin() = 0;
  // `bytes` of device memory named `name` (grown, never shrunk, reused by the next forward); null after
  // an error (which finish() returns).
  virtual DevicePtr<void> alloc(const char* name, int64_t bytes) = 0;
  // alloc(name, bytes) holding a copy of host[bytes], made now (before finish() runs the kernels).
  virtual DevicePtr<void> copy_in(const char* name, const void* host, int64_t bytes) = 0;
  virtual Status status() const = 0;  // the first error since begin()
  virtual Status finish() = 0;
  // Copies device[bytes] to host[bytes] as part of the work finish() runs (no submission or wait of its own):
  // `host` holds it once finish() has returned ok, and must stay valid until then. `name` names the
  // persistent staging memory it goes through (grown, never shrunk).
  virtual void copy_out(const char* name, DevicePtr<const void> device, void* host, int64_t bytes) = 0;

  // The ops of ops/matmul.h, ops/elementwise.h, ops/attention.h and ops/attention_window.h with device
  // pointers (attention: the window [window_begin, window_begin + window_len) of queries; the full attention
  // is the window [0, n_seq)). Weights, norm weights and biases are named by their host views (host
  // pointers, never read here: the keys of add_matrix / add_vector's copies).
  virtual void matmul_nt(DeviceIn x, int64_t n, const WeightView& w, const float* bias, DeviceOut y) = 0;
  virtual void rms_norm(DeviceIn x, const float* w, int64_t n, int64_t d, float eps, DeviceOut y) = 0;
  virtual void rope_apply(DeviceOut x, int64_t n, int64_t n_heads, int64_t head_dim, DeviceIn cos, DeviceIn sin) = 0;
  virtual void swiglu(DeviceIn gate, DeviceIn up, int64_t count, DeviceOut out) = 0;
  virtual void add_inplace(DeviceOut y, DeviceIn x, int64_t count) = 0;
  virtual void scale(DeviceIn x, int64_t count, float s, DeviceOut y) = 0;  // y = s·x (y may be x)
  // ops/dropout.h dropout_hashed over x [n, d] with its threshold and 1/(1 − p) (y may be x).
  virtual void dropout(DeviceIn x, int64_t n, int64_t d, uint64_t seed, uint64_t threshold, float keep_scale, DeviceOut y) = 0;
  // ops/elementwise.h copy_floats and zero_fill: y[count] = x[count] (bit for bit; x and y may start inside their
  // buffers, on a word: a chunk of rows), y[count] = 0.
  virtual void copy(DeviceIn x, int64_t count, DeviceOut y) = 0;
  virtual void zero_fill(DeviceOut y, int64_t count) = 0;
  // matmul_nt with the element-wise pass after it in the product's store (ops/matmul.h matmul_nt_residual,
  // matmul_nt_swiglu): h[n, w.rows] += x · wᵀ; out[n, w.rows] = silu(gate) · (x · wᵀ) (out may be gate).
  virtual void matmul_nt_residual(DeviceIn x, int64_t n, const WeightView& w, DeviceOut h) = 0;
  virtual void matmul_nt_swiglu(DeviceIn x, int64_t n, const WeightView& w, DeviceIn gate, DeviceOut out) = 0;
  virtual void embedding(const WeightView& table, DevicePtr<const int32_t> ids, int64_t n, DeviceOut out) = 0;
  virtual void gather_rows(DeviceIn x, int64_t cols, DevicePtr<const int32_t> rows, int64_t n, DeviceOut out) = 0;
  virtual void attention(const AttentionShape& shape, int64_t window_begin, int64_t window_len, DeviceIn q, DeviceIn k, DeviceIn v,
                         DevicePtr<const uint8_t> valid, DeviceOut out) = 0;
  // ops/attention_window.h rope_kv: RoPE on q and k in place and, with cache_k non-null, the window's k and v
  // into the KV cache, in one pass. attention's operands, and rope_kv's but its caches, may start inside a buffer
  // (a part's rows of a forward of parts), on an element's boundary.
  virtual void rope_kv(const AttentionShape& shape, int64_t window_begin, int64_t window_len, DeviceOut q, DeviceOut k, DeviceIn v,
                       DeviceIn cos, DeviceIn sin, DeviceOut cache_k, DeviceOut cache_v) = 0;
  virtual void kv_store(DeviceIn src, int64_t n_batch, int64_t n_seq, int64_t window_begin, int64_t window_len,
                        int64_t cols, DeviceOut cache) = 0;
  // The head sampler's step (engine/device_head_sampler.h) per row of logits[n, n_vocab] with `filter`:
  // ids[n] the token (the argmax, lowest id on ties, at temperature 0; else the categorical draw of
  // uniforms[n], f32 in [0, 1), in sampler/filters.h's order) and conf[n, 3] of the filtered softmax: the
  // token's probability, the top-1 − top-2 margin and Σ p·log(p + 1e-10) (NaN for a row with a NaN or +inf
  // logit or every logit −inf), sampler/filters.h's rules throughout. The four operands may start at an offset
  // into their buffers (a merged step samples each request's rows of one logits block with its own filter).
  virtual void sample_rows(DeviceIn logits, int64_t n, int64_t n_vocab, const FilterConfig& filter, DeviceIn uniforms,
                           DevicePtr<int32_t> ids, DeviceOut conf) = 0;

  // ---- Training: the backward ops of ops/elementwise.h, ops/matmul.h and ops/attention.h, the loss rows'
  // cross-entropy (ops/loss.h) and the optimizer's reduction and AdamW (ops/adamw.h), with device pointers
  // (a null pointer: not wanted, where the op allows it). Weights and norm weights are named by their host
  // views as in the forward; every product is f32.
  // matmul_nt_backward: dx (+)= dy·w, dw (+)= dyᵀ·x, dbias (+)= Σ_rows dy (add: accumulate_dx / accumulate_dw).
  virtual void matmul_nt_backward(DeviceIn x, int64_t n, const WeightView& w, DeviceIn dy, DeviceOut dx, DeviceOut dw,
                                  DeviceOut dbias, bool accumulate_dx, bool accumulate_dw) = 0;
  virtual void rms_norm_backward(DeviceIn x, const float* w, DeviceIn dy, int64_t n, int64_t d, float eps, DeviceOut dx, DeviceOut dw) = 0;
  virtual void rope_backward(DeviceOut dx, int64_t n, int64_t n_heads, int64_t head_dim, DeviceIn cos, DeviceIn sin) = 0;
  virtual void swiglu_backward(DeviceIn gate, DeviceIn up, DeviceIn dout, int64_t count, DeviceOut dgate, DeviceOut dup) = 0;
  virtual void embedding_backward(DevicePtr<const int32_t> ids, int64_t n, DeviceIn dy, int64_t cols, DeviceOut dtable) = 0;
  virtual void attention_backward(const AttentionShape& shape, DeviceIn q, DeviceIn k, DeviceIn v, DevicePtr<const uint8_t> valid,
                                  DeviceIn out, DeviceIn dout, DeviceOut dq, DeviceOut dk, DeviceOut dv) = 0;
  // loss[0] = Σ_r weights[r]·CE_r (f32, a fixed order), ce[n] each row's CE, dlogits (may be logits) its gradient.
  virtual void cross_entropy(DeviceIn logits, DevicePtr<const int32_t> targets, DeviceIn weights, int64_t n, int64_t n_vocab,
                             DeviceOut dlogits, DeviceOut ce, DeviceOut loss) = 0;
  // out[out_index] = Σ x² (`squares`) or Σ x over x [n] (f32, a fixed order).
  virtual void reduce(DeviceIn x, int64_t n, bool squares, DeviceOut out, int64_t out_index) = 0;
  // AdamW over p, g, m, v [n]; with clip_sumsq: skipped when Σ g² = clip_sumsq[0] is not finite, else the
  // gradients first scaled by clip_grad_norm's coefficient for max_norm (s.grad_scale unused); else by s.grad_scale.
  virtual void adamw_update(const AdamWStep& s, DeviceOut p, DeviceIn g, DeviceOut m, DeviceOut v, int64_t n, DeviceIn clip_sumsq,
                            float max_norm) = 0;
};

// Opens Vulkan device `index` (ops/vulkan/runtime.h's order). Errors: kUnimplemented (built without
// Vulkan), kNotFound (no loader, driver or device), kOutOfRange (no such index, listing the devices).
Result<std::unique_ptr<DeviceBackend>> open_vulkan_backend(int index);

// n floats of the forward named `name`: ctx.workspace's on the CPU (which must be set), the backend's
// device memory on a device as a forward operand (as_operand; nullptr after a device error).
float* device_floats(const Context& ctx, const char* name, int64_t n);

// The device's first error of this forward (ok on the CPU): check it after the allocations, before the ops,
// which need non-null operands.
Status device_status(const Context& ctx);

// host[n] where ctx's ops read it: the host pointer itself on the CPU, a device copy named `name` on a
// device as a forward operand (as_operand; nullptr stays nullptr).
template <typename T>
const T* device_copy(const Context& ctx, const char* name, const T* host, int64_t n) {
  if (ctx.device == Device::kCpu || host == nullptr) return host;
  return as_operand(device_cast<const T>(ctx.backend->copy_in(name, host, n * static_cast<int64_t>(sizeof(T)))));
}

}  // namespace dc
