// The Vulkan compute backend's runtime: device listing and selection, device buffers with host staging,
// synchronous and fenced asynchronous uploads, compute pipelines (one per shader and specialization),
// and Sequences: command buffers recorded once per shape and replayed (uploads from persistent staging
// buffers included), with GPU timestamps.
// No Vulkan type appears here (every handle lives in runtime.cc), so callers build without the SDK; the
// loader (libvulkan.so.1) is opened at run time, and every failure — no loader, no driver, no device,
// out of device memory, a lost device — is a Status, never a crash.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dc::vk {

inline constexpr const char* kDefaultLoader = "libvulkan.so.1";

// What `diffucoder devices` lists of one Vulkan physical device.
struct DeviceInfo {
  int index = 0;                   // the N of --device vulkan:N (the loader's enumeration order)
  std::string name;                // e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
  std::string type;                // "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other"
  std::string api_version;         // e.g. "1.3.230"
  int64_t device_local_bytes = 0;  // the largest device-local memory heap
  int64_t max_buffer_bytes = 0;    // the largest storage-buffer binding (maxStorageBufferRange)
  int64_t max_shared_bytes = 0;    // a workgroup's shared memory (maxComputeSharedMemorySize, >= 16 KiB)
  int64_t max_workgroup_x = 0;     // invocations of a 1-D workgroup (maxComputeWorkGroupInvocations and Size[0], >= 128)
  uint32_t subgroup_size = 0;
  bool fp16 = false;               // shaderFloat16 arithmetic
  bool int8 = false;               // shaderInt8 arithmetic
  bool bf16 = false;               // VK_KHR_shader_bfloat16
  bool cooperative_matrix = false; // VK_KHR_cooperative_matrix (or VK_NV_cooperative_matrix)
  // The matrix units the GEMM uses (shaders/matmul_coop.comp): VK_NV_cooperative_matrix with a 16×16×16
  // f16 × f16 → f32 subgroup shape, shaderFloat16, the Vulkan memory model and 32-wide subgroups.
  bool matrix_units = false;
  bool compute_queue = false;      // has a queue family with compute: usable by the backend
};

// True when this build has the backend (DIFFUCODER_VULKAN found the headers and glslc).
bool compiled_in();

// Every Vulkan device the loader sees. Errors: kUnimplemented (built without Vulkan: the one error of such a
// build, disabled.cc), kNotFound (no loader library, or no driver: "install mesa-vulkan-drivers or the GPU's
// driver").
Result<std::vector<DeviceInfo>> list_devices(const char* loader = kDefaultLoader);

class Runtime;

// The host-side work of one Runtime since it was opened: what a forward costs the host, counted (on lavapipe
// the timings are a CPU's, not a GPU's; the counts are the same on any device).
struct Counters {
  int64_t recordings = 0;           // command buffers recorded (Sequences built)
  int64_t dispatches_recorded = 0;  // dispatches recorded into them
  int64_t dispatches_run = 0;       // dispatches of the sequences run (recorded or replayed)
  int64_t descriptor_sets = 0;      // descriptor sets allocated and written
  int64_t submits = 0;              // vkQueueSubmit calls (sequences run, uploads, downloads)
  int64_t uploads = 0;              // host-to-device copies
  int64_t upload_bytes = 0;
  int64_t downloads = 0;            // device-to-host copies
  double record_ms = 0;             // host time spent recording dispatches (descriptor sets included)
  int64_t device_bytes = 0;         // device-local buffers held now (their sizes as asked; staging not counted)
  int64_t device_peak_bytes = 0;    // the most device_bytes has been
};

// A device-local storage buffer of `bytes()` bytes. Move-only; freed on destruction, which must come
// before the Runtime's. A Sequence that binds it must not be run after it is freed. Only the Runtime that
// allocated it (and its Sequences) accept it: another device's buffer, or an empty one, is kInvalidArgument.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  int64_t bytes() const { return bytes_; }
  bool empty() const { return runtime_ == nullptr; }

 private:
  friend class Runtime;
  friend class Sequence;
  Runtime* runtime_ = nullptr;
  uint32_t slot_ = 0;  // index into the runtime's buffer table
  uint64_t id_ = 0;    // unique per allocation in the Runtime (a slot is reused; an id never is)
  int64_t bytes_ = 0;
};

// An upload in flight (Runtime::upload_async): its staging copy, command buffer and fence. wait()
// returns when the data is on the device; the destructor waits too.
class Upload {
 public:
  Upload() = default;
  Upload(Upload&& other) noexcept;
  Upload& operator=(Upload&& other) noexcept;
  ~Upload();
  Status wait();
  struct Impl;

 private:
  friend class Runtime;
  std::unique_ptr<Impl> impl_;
};

// One compute dispatch: a shader by name (shaders/<name>.comp; a string that outlives the Sequence, which
// keeps a view of it for DC_VULKAN_PROFILE: the kernels pass literals), its specialization constants (ids 0, 1,
// ... in order), its storage buffers (bindings 0, 1, ... in order; a `nullptr` entry binds a dummy
// buffer, for bindings a specialization does not read), its push constants (at most 128 bytes) and the
// workgroup counts.
struct Dispatch {
  std::string_view shader;
  std::vector<int32_t> spec;
  std::vector<const Buffer*> buffers;
  std::vector<uint32_t> push;
  uint32_t groups_x = 1, groups_y = 1, groups_z = 1;
};

// Push-constant words from floats and integers.
uint32_t push_float(float f);

// A command buffer recorded once and run any number of times: record() and upload() collect commands on
// the host (each command sees the writes of the previous ones: a barrier between them), the first run()
// records them into a command buffer (descriptor sets included) and every run() submits it. The shapes and
// buffers are fixed at record time, the buffers' contents may change between runs (the forward of one
// shape, replayed). same_work() tells two sequences that would record the same commands apart from others,
// so that a caller can replay a recorded one instead (ops/vulkan_backend.cc keeps a bounded cache).
class Sequence {
 public:
  Sequence(Sequence&& other) noexcept;
  Sequence& operator=(Sequence&& other) noexcept;
  ~Sequence();
  // Appends a dispatch. Errors: a shader not embedded, a pipeline the driver refuses, more than 8
  // buffers or 128 bytes of push constants (kInvalidArgument), recording after the first run().
  Status record(const Dispatch& dispatch);
  // Copies src[bytes] into `staging` (a Runtime::alloc_staging buffer) now, and appends a copy of the whole
  // staging buffer (up to dst's size) into dst to the commands — the same command whatever `bytes`, so
  // that uploads of other sizes through the same buffers replay: the upload travels in the sequence's own
  // submission (no submit or wait of its own). `staging` must not be written again until the run that
  // reads it has returned. Errors: a device buffer as staging, bytes beyond either buffer.
  Status upload(Buffer& staging, const void* src, int64_t bytes, Buffer& dst);
  // Appends a copy of src (up to the staging buffer's size) into `staging` (a Runtime::alloc_staging buffer),
  // the reverse of upload(): after each run, Runtime::read_staging reads it on the host (the download travels in
  // the sequence's own submission). Errors: a device buffer as staging, a staging buffer as src.
  Status download(const Buffer& src, Buffer& staging);
  // The same commands (shaders, specializations, buffers, push constants, groups, copies) as `other`.
  bool same_work(const Sequence& other) const;
  // Submits the recorded work (recording it at the first call) and waits for it. Errors: a lost device
  // (kInternal, "reopen the device"); a recording that failed (the sequence is spent: make a new one).
  Status run();
  // Runs `seqs` in order in one submission (each recorded at its first run; the barrier at the start of
  // each makes the earlier ones' writes visible; one may appear more than once) and waits. Errors as run()'s.
  static Status run_all(const std::vector<Sequence*>& seqs);
  // run(), returning the GPU time between the first and the last dispatch in milliseconds (timestamps).
  Result<double> run_timed();
  int dispatches() const;
  bool empty() const;  // no command collected
  const DeviceInfo& device() const;  // the device it runs on
  struct Impl;

 private:
  friend class Runtime;
  explicit Sequence(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One opened device: its instance, logical device, one compute queue, pools and the pipeline cache.
// One thread at a time (the owner of a Context). Buffers and Sequences must be destroyed before it.
class Runtime {
 public:
  // Opens device `index` of list_devices(). Errors: kNotFound (no loader / driver / device), kOutOfRange
  // (index beyond the devices, listing them), kInternal.
  static Result<std::unique_ptr<Runtime>> open(int index, const char* loader = kDefaultLoader);
  ~Runtime();
  const DeviceInfo& info() const;

  // A device-local buffer (contents undefined). `what` names it in errors. Errors: kResourceExhausted
  // when `bytes` exceeds the device-local heap or the driver runs out of memory; kOutOfRange beyond the
  // largest storage-buffer binding; kInvalidArgument for bytes <= 0.
  Result<Buffer> alloc(int64_t bytes, std::string_view what);
  // A host-visible staging buffer for Sequence::upload (not bindable by a dispatch). Errors as alloc's.
  Result<Buffer> alloc_staging(int64_t bytes, std::string_view what);
  // Copies bytes from the host into dst at `offset` through a staging buffer and waits.
  Status upload(Buffer& dst, const void* src, int64_t bytes, int64_t offset = 0);
  // Starts the same copy and returns at once (the host data is already copied into staging memory, so
  // `src` may be reused); wait on the Upload before a Sequence reads dst.
  Result<Upload> upload_async(Buffer& dst, const void* src, int64_t bytes, int64_t offset = 0);
  // Copies bytes from src at `offset` to the host and waits.
  Status download(const Buffer& src, void* dst, int64_t bytes, int64_t offset = 0) const;
  // Copies the first `bytes` of a staging buffer (what a run's Sequence::download left there) to the host.
  Status read_staging(const Buffer& staging, void* dst, int64_t bytes) const;
  // Typed helpers: a buffer holding `values`, and a buffer's first n elements read back.
  template <typename T>
  Result<Buffer> make_buffer(const std::vector<T>& values, std::string_view what) {
    DC_ASSIGN_OR_RETURN(Buffer b, alloc(static_cast<int64_t>(values.size() * sizeof(T)), what));
    DC_RETURN_IF_ERROR(upload(b, values.data(), b.bytes()));
    return b;
  }
  template <typename T>
  Result<std::vector<T>> read(const Buffer& b, int64_t n) const {
    std::vector<T> out(static_cast<size_t>(n));
    DC_RETURN_IF_ERROR(download(b, out.data(), n * static_cast<int64_t>(sizeof(T))));
    return out;
  }

  // An empty sequence (nothing is created on the device until its first run()).
  Result<Sequence> new_sequence();
  const Counters& counters() const;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  friend class Buffer;
  explicit Runtime(std::unique_ptr<Impl> impl);
  void free_buffer(uint32_t slot);
  Result<Buffer> alloc_buffer(int64_t bytes, std::string_view what, bool staging);
  Result<Upload> start_copy(const Buffer& device_buffer, int64_t offset, int64_t bytes, bool to_device, const void* src) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dc::vk
