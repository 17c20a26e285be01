// The Vulkan DeviceBackend (ops/device.h): the weights uploaded once in their stored row-major layout
// (ops/vulkan/kernels.h DeviceMatrix), the forward's named device buffers, and each op collected into one
// Sequence per forward (ops/vulkan/runtime.h) that finish() runs. Recorded once per shape, replayed: the
// named buffers are stable (grown, never shrunk), the host inputs (copy_in: tokens, RoPE tables, the out
// rows, the padding mask) go through a persistent staging buffer per name and are copied in the sequence's
// own submission, so a forward of a shape seen before collects the same commands, and finish() runs the
// command buffer recorded for it (a cache of the kMaxRecorded last used) instead of recording a new one.
// The results (copy_out: logits, the sampler's ids and confidences) come back the same way, copied into a
// staging buffer in the same submission: a forward is one submit and one wait. The staging buffer is
// persistent per name up to kKeptOutBytes (the sampler's few numbers per row); a larger copy (rows of logits)
// gets one for its forward only, so that no host memory the size of a logits block stays pinned (that
// forward's last segment then records anew).
// A forward is collected in segments, each replayed on its own and all run in one submission: a gather of
// rows starts a new one, as it is where a forward's per-step shape begins (the out rows after the layers,
// whose number changes every step while the canvas does not; the head's masked rows). A device pointer
// (ops/device.h DevicePtr) is the handle (slot + 1) << 40 of a named forward buffer or of caller-owned memory
// (allocate: the KV cache) plus a byte offset below bit 40: an operand is the start of one, except for the
// per-part ops of a forward of parts (rope_kv, attention), sample_rows (a merged step's request) and copy (a
// chunk of the loss rows), whose operands may start at a part's rows inside buffers that stack several parts (the
// offset goes to the shader as a push constant).
#include <algorithm>
#include <ctime>
#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/check.h"
#include "ops/device.h"
#include "ops/vulkan/backward_kernels.h"
#include "ops/vulkan/kernels.h"
#include "ops/vulkan/runtime.h"

namespace dc {
namespace {

constexpr int kAddressShift = 40;  // DevicePtr handles: slot in the high bits, a byte offset below
// Recorded sequences kept for replay: the forward of a generation's shape and the head sampler's few.
constexpr size_t kMaxRecorded = 8;
// copy_out's largest persistent staging buffer (above: one per forward).
constexpr int64_t kKeptOutBytes = int64_t{4} << 20;

class VulkanBackend;

// The calling thread's CPU time (not the wall's: on a shared machine, or on lavapipe, whose threads run the
// kernels on the same cores, the collection's wall time is mostly waiting for a core).
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// allocate()'s memory: a buffer in the backend's address table, handed back to it on destruction.
class VulkanMemory final : public DeviceMemory {
 public:
  VulkanMemory(VulkanBackend* owner, size_t slot) : owner_(owner), slot_(slot) {}
  ~VulkanMemory() override;
  DevicePtr<float> data() const override { return DevicePtr<float>::from_handle(uint64_t{slot_ + 1} << kAddressShift); }

 private:
  VulkanBackend* owner_;
  size_t slot_;
};

class VulkanBackend final : public DeviceBackend {
 public:
  explicit VulkanBackend(std::unique_ptr<vk::Runtime> rt) : rt_(std::move(rt)) {
    // The split GEMMs' and attentions' partial sums (kernels.h): without it (out of memory) they run unsplit.
    if (auto scratch = rt_->alloc(kSplitScratchBytes, "split partial sums"); scratch.ok()) split_scratch_ = std::move(*scratch);
  }
  ~VulkanBackend() override {  // everything recorded or allocated goes before the runtime
    seq_.reset(), segments_.clear(), recorded_.clear();
    table_.clear(), owned_.clear(), arena_.clear(), staging_in_.clear(), staging_out_.clear(), matrices_.clear(), vectors_.clear();
  }

  std::string name() const override { return rt_->info().name; }
  int64_t memory_bytes() const override { return rt_->info().device_local_bytes; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  void set_matrix_units(bool allowed) override { matrix_units_ = allowed && rt_->info().matrix_units; }
  std::string arithmetic() const override {
    return matrix_units_ ? "f16 matrix units, f32 accumulation, for bf16 / f16 weights (f32 for the rest)" : "f32";
  }
  DeviceCounters counters() const override {
    const vk::Counters& c = rt_->counters();
    return {runs_, c.recordings, c.dispatches_recorded, c.descriptor_sets, c.submits, c.uploads, c.upload_bytes, c.downloads, c.record_ms,
            c.dispatches_run, collect_ms_, c.device_bytes, c.device_peak_bytes};
  }

  Status add_matrix(const WeightView& w, const std::string& name) override {
    if (matrices_.count(w.data) != 0) return Status();
    if (w.layout != WeightLayout::kRowMajor)
      return invalid_argument(name + ": packed (kPanels) weights are the CPU's layout; upload the row-major weights");
    if (w.quant == WeightQuant::kGguf)
      return unimplemented(name + ": " + cpu::ggml_block_info(w.ggml_type).name +
                           " blocks of a quantized GGUF run on the CPU only (--device cpu); for a device, use an F16 / BF16 "
                           "GGUF or a checkpoint directory converted with diffucoder convert --weights q8|q4");
    const vk::HostMatrix host{w.dtype, w.quant, w.rows, w.cols, w.group_size, w.data, w.scales, w.mins};
    DC_ASSIGN_OR_RETURN(vk::DeviceMatrix d, vk::upload_matrix(*rt_, host, name));
    weight_bytes_ += d.data.bytes() + d.scales.bytes() + d.mins.bytes();
    matrices_.emplace(w.data, std::move(d));
    return Status();
  }

  Status add_vector(const float* v, int64_t n, const std::string& name) override {
    if (vectors_.count(v) != 0) return Status();
    DC_ASSIGN_OR_RETURN(vk::Buffer b, rt_->alloc(n * 4, name));
    DC_RETURN_IF_ERROR(rt_->upload(b, v, n * 4));
    weight_bytes_ += b.bytes();
    vectors_.emplace(v, std::move(b));
    return Status();
  }

  Status check_head_dim(int64_t head_dim) const override {
    return vk::check_attention_head_dim(head_dim, rt_->info().max_shared_bytes);
  }

  Result<DevicePtr<float>> weight_memory(const void* host, const std::string& name) override {
    vk::Buffer* buffer = nullptr;
    if (auto m = matrices_.find(host); m != matrices_.end()) {
      if (m->second.dtype != DType::kF32 || m->second.quant != WeightQuant::kNone)
        return invalid_argument(name + ": the device holds it in " + dtype_name(m->second.dtype) + "; training updates f32 weights");
      buffer = &m->second.data;
    } else if (auto v = vectors_.find(static_cast<const float*>(host)); v != vectors_.end()) {
      buffer = &v->second;
    } else {
      return invalid_argument(name + ": never uploaded to " + this->name() + " (Model::to_device)");
    }
    const std::lock_guard<std::mutex> guard(table_mutex_);
    auto [it, fresh] = weight_slots_.try_emplace(host, 0);
    if (fresh) {
      it->second = new_slot();
      table_[it->second] = buffer;
    }
    return DevicePtr<float>::from_handle(uint64_t{it->second + 1} << kAddressShift);
  }

  void drop_weight(const void* host) override {
    recorded_.clear();  // no replayed command buffer may bind the freed copy
    if (auto m = matrices_.find(host); m != matrices_.end()) {
      weight_bytes_ -= m->second.data.bytes() + m->second.scales.bytes() + m->second.mins.bytes();
      matrices_.erase(m);
    } else if (auto v = vectors_.find(static_cast<const float*>(host)); v != vectors_.end()) {
      weight_bytes_ -= v->second.bytes();
      vectors_.erase(v);
    }
    const std::lock_guard<std::mutex> guard(table_mutex_);
    if (auto s = weight_slots_.find(host); s != weight_slots_.end()) {
      table_[s->second] = nullptr;
      free_slots_.push_back(s->second);
      weight_slots_.erase(s);
    }
  }

  Result<std::unique_ptr<DeviceMemory>> allocate(int64_t bytes, const std::string& what) override {
    DC_ASSIGN_OR_RETURN(vk::Buffer b, rt_->alloc((bytes + 3) / 4 * 4, what));
    const std::lock_guard<std::mutex> guard(table_mutex_);
    const size_t slot = new_slot();
    table_[slot] = &owned_.emplace(slot, std::move(b)).first->second;
    return std::unique_ptr<DeviceMemory>(new VulkanMemory(this, slot));
  }

  // VulkanMemory's destructor (any thread, maybe during another forward): freed at the next begin().
  void release(size_t slot) {
    const std::lock_guard<std::mutex> guard(table_mutex_);
    released_.push_back(slot);
  }

  std::unique_lock<std::mutex> lock() override { return std::unique_lock<std::mutex>(mutex_); }

  Status begin() override {
    begun_ms_ = thread_cpu_ms();
    seq_.reset(), segments_.clear();
    {
      const std::lock_guard<std::mutex> guard(table_mutex_);
      for (size_t slot : released_) {
        owned_.erase(slot);
        table_[slot] = nullptr;
        free_slots_.push_back(slot);
      }
      released_.clear();
    }
    status_ = Status();
    outs_.clear();
    transient_.clear();
    named_this_forward_.clear();
    DC_ASSIGN_OR_RETURN(vk::Sequence seq, rt_->new_sequence());
    seq_.emplace(std::move(seq));
    return Status();
  }

  DevicePtr<void> alloc(const char* name, int64_t bytes) override {
    if (!status_.ok() || bytes <= 0) return nullptr;
    const int64_t words = (bytes + 3) / 4 * 4;  // the shaders read whole 32-bit words
    auto [it, fresh] = slots_.try_emplace(name, 0);
    if (fresh) {
      const std::lock_guard<std::mutex> guard(table_mutex_);
      it->second = new_slot();
      table_[it->second] = &arena_.emplace_back();
    }
    vk::Buffer& b = *table_[it->second];
    const bool used = !named_this_forward_.insert(it->second).second;  // this forward's commands may bind b
    if (b.bytes() < words) {
      // Grown: freed first (the peak stays one buffer), or, when this forward's earlier commands bind it (a
      // kernel's scratch asked for again with more rows), kept until the run.
      if (used) transient_.push_back(std::move(b));
      b = vk::Buffer();
      auto grown = rt_->alloc(words, std::string("forward buffer ") + name);
      if (!grown.ok()) {
        status_ = grown.status();
        return nullptr;
      }
      b = std::move(grown).value();
    }
    return DevicePtr<void>::from_handle(uint64_t{it->second + 1} << kAddressShift);
  }

  DevicePtr<void> copy_in(const char* name, const void* host, int64_t bytes) override {
    const DevicePtr<void> p = alloc(name, bytes);
    if (!p) return nullptr;
    vk::Buffer* staging = staging_for(staging_in_, name, bytes);
    if (staging != nullptr) keep(seq_->upload(*staging, host, bytes, at(p)));
    return status_.ok() ? p : nullptr;
  }

  void copy_out(const char* name, DevicePtr<const void> device, void* host, int64_t bytes) override {
    if (!recording() || bytes <= 0) return;
    const vk::Buffer& src = at(device);
    if (!status_.ok()) return;
    if (bytes > src.bytes()) return keep(out_of_range(std::string("copy_out ") + name + ": " + std::to_string(bytes) +
                                                      " bytes from a device buffer of " + std::to_string(src.bytes())));
    if (std::any_of(outs_.begin(), outs_.end(), [&](const Out& o) { return o.name == name; }))
      return keep(invalid_argument("copy_out " + std::string(name) + " twice in one forward; give each its own name"));
    vk::Buffer* staging = nullptr;
    if (bytes <= kKeptOutBytes) {
      staging = staging_for(staging_out_, name, bytes);
    } else {
      auto once = rt_->alloc_staging((bytes + 3) / 4 * 4, std::string("the staging buffer of copy_out ") + name);
      if (!once.ok()) return keep(once.status());
      staging = &transient_.emplace_back(std::move(once).value());
    }
    if (staging == nullptr) return;
    keep(seq_->download(src, *staging));
    outs_.push_back({name, staging, host, bytes});
  }

  Status status() const override { return status_; }

  Status finish() override {
    DC_CHECK(seq_.has_value(), "VulkanBackend::finish without begin");
    if (status_.ok()) {
      collect_ms_ += thread_cpu_ms() - begun_ms_;
      segments_.push_back(std::move(*seq_));
      std::vector<vk::Sequence*> run;
      for (vk::Sequence& s : segments_)
        if (!s.empty()) run.push_back(&replayable(std::move(s)));
      status_ = vk::Sequence::run_all(run);
      if (!status_.ok())  // a failed recording or run is never replayed
        recorded_.remove_if([&](const vk::Sequence& s) { return std::find(run.begin(), run.end(), &s) != run.end(); });
      for (const Out& o : outs_)
        if (status_.ok()) status_ = rt_->read_staging(*o.staging, o.host, o.bytes);
    }
    outs_.clear();
    transient_.clear();
    segments_.clear();
    seq_.reset();
    ++runs_;
    return status_;
  }

  void matmul_nt(DeviceIn x, int64_t n, const WeightView& w, const float* bias, DeviceOut y) override {
    if (recording()) keep(vk::matmul_nt(*seq_, at(x), n, matrix(w), vector(bias), at(y), matrix_units_, &split_scratch_));
  }
  void matmul_nt_residual(DeviceIn x, int64_t n, const WeightView& w, DeviceOut h) override {
    if (recording())
      keep(vk::matmul_nt(*seq_, at(x), n, matrix(w), nullptr, at(h), matrix_units_, &split_scratch_, {vk::Epilogue::kAdd, &at(h)}));
  }
  void matmul_nt_swiglu(DeviceIn x, int64_t n, const WeightView& w, DeviceIn gate, DeviceOut out) override {
    if (recording())
      keep(vk::matmul_nt(*seq_, at(x), n, matrix(w), nullptr, at(out), matrix_units_, &split_scratch_, {vk::Epilogue::kSwiglu, &at(gate)}));
  }
  void rms_norm(DeviceIn x, const float* w, int64_t n, int64_t d, float eps, DeviceOut y) override {
    if (recording()) keep(vk::rms_norm(*seq_, at(x), *vector(w), n, d, eps, at(y)));
  }
  void rope_apply(DeviceOut x, int64_t n, int64_t n_heads, int64_t head_dim, DeviceIn cos, DeviceIn sin) override {
    if (recording()) keep(vk::rope_apply(*seq_, at(x), n, n_heads, head_dim, at(cos), at(sin)));
  }
  void swiglu(DeviceIn gate, DeviceIn up, int64_t count, DeviceOut out) override {
    if (recording()) keep(vk::swiglu(*seq_, at(gate), at(up), count, at(out)));
  }
  void add_inplace(DeviceOut y, DeviceIn x, int64_t count) override {
    if (recording()) keep(vk::add_inplace(*seq_, at(y), at(x), count));
  }
  void scale(DeviceIn x, int64_t count, float s, DeviceOut y) override {
    if (recording()) keep(vk::scale(*seq_, at(x), count, s, at(y)));
  }
  void dropout(DeviceIn x, int64_t n, int64_t d, uint64_t seed, uint64_t threshold, float keep_scale, DeviceOut y) override {
    if (recording()) keep(vk::dropout(*seq_, at(x), n, d, seed, threshold, keep_scale, at(y)));
  }
  void copy(DeviceIn x, int64_t count, DeviceOut y) override {
    if (!recording()) return;
    int64_t x_offset = 0, y_offset = 0;  // rows of a buffer: the loss rows' chunks (train/device_training.cc)
    vk::Buffer &x_at = at(x, 4, &x_offset), &y_at = at(y, 4, &y_offset);
    keep(vk::copy(*seq_, x_at, x_offset, count, y_at, y_offset));
  }
  void zero_fill(DeviceOut y, int64_t count) override {
    if (recording()) keep(vk::zero_fill(*seq_, at(y), count));
  }
  void embedding(const WeightView& table, DevicePtr<const int32_t> ids, int64_t n, DeviceOut out) override {
    if (recording()) keep(vk::gather_rows(*seq_, matrix(table), at(ids), n, at(out)));
  }
  void gather_rows(DeviceIn x, int64_t cols, DevicePtr<const int32_t> rows, int64_t n, DeviceOut out) override {
    if (!recording()) return;
    if (!seq_->empty()) {  // a new segment (see the top of the file)
      segments_.push_back(std::move(*seq_));
      auto seq = rt_->new_sequence();
      if (!seq.ok()) return keep(seq.status());
      seq_.emplace(std::move(seq).value());
    }
    keep(vk::gather_rows(*seq_, at(x), cols, at(rows), n, at(out)));
  }
  void attention(const AttentionShape& s, int64_t window_begin, int64_t window_len, DeviceIn q, DeviceIn k, DeviceIn v,
                 DevicePtr<const uint8_t> valid, DeviceOut out) override {
    if (!recording()) return;
    const vk::AttentionDims dims{s.n_batch, s.n_seq, s.n_head, s.n_head_kv, s.head_dim};
    vk::AttentionOffsets offsets;
    vk::Buffer &q_at = at(q, 4, &offsets.q), &k_at = at(k, 4, &offsets.k), &v_at = at(v, 4, &offsets.v);
    vk::Buffer* valid_at = valid ? &at(valid, 1, &offsets.valid) : nullptr;
    vk::Buffer& out_at = at(out, 4, &offsets.out);
    if (recording()) keep(vk::attention(*seq_, dims, window_begin, window_len, q_at, k_at, v_at, valid_at, out_at, &split_scratch_, offsets));
  }
  void rope_kv(const AttentionShape& s, int64_t window_begin, int64_t window_len, DeviceOut q, DeviceOut k, DeviceIn v, DeviceIn cos,
               DeviceIn sin, DeviceOut cache_k, DeviceOut cache_v) override {
    if (!recording()) return;
    const vk::KvWindow window{s.n_batch, s.n_seq, window_begin, window_len};
    const bool store = static_cast<bool>(cache_k);
    vk::RopeKvOffsets offsets;
    vk::Buffer &q_at = at(q, 4, &offsets.q), &k_at = at(k, 4, &offsets.k), &cos_at = at(cos, 4, &offsets.cos), &sin_at = at(sin, 4, &offsets.sin);
    vk::Buffer* v_at = store ? &at(v, 4, &offsets.v) : nullptr;
    if (recording())
      keep(vk::rope_kv(*seq_, q_at, k_at, s.n_batch * window_len, s.n_head, s.n_head_kv, s.head_dim, cos_at, sin_at, store ? &window : nullptr,
                       v_at, store ? &at(cache_k) : nullptr, store ? &at(cache_v) : nullptr, offsets));
  }
  void kv_store(DeviceIn src, int64_t n_batch, int64_t n_seq, int64_t window_begin, int64_t window_len, int64_t cols,
                DeviceOut cache) override {
    if (recording()) keep(vk::kv_store(*seq_, at(src), n_batch, n_seq, window_begin, window_len, cols, at(cache)));
  }
  void sample_rows(DeviceIn logits, int64_t n, int64_t n_vocab, const FilterConfig& filter, DeviceIn uniforms,
                   DevicePtr<int32_t> ids, DeviceOut conf) override {
    if (!recording()) return;
    const vk::RowFilter f{filter.temperature, filter.top_p, filter.top_k};
    vk::SampleRowsOffsets offsets;
    vk::Buffer &logits_at = at(logits, 4, &offsets.logits), &uniforms_at = at(uniforms, 4, &offsets.uniforms);
    vk::Buffer &ids_at = at(ids, 4, &offsets.ids), &conf_at = at(conf, 4, &offsets.conf);
    keep(vk::sample_rows(*seq_, logits_at, n, n_vocab, f, uniforms_at, ids_at, conf_at, offsets));
  }

  void matmul_nt_backward(DeviceIn x, int64_t n, const WeightView& w, DeviceIn dy, DeviceOut dx, DeviceOut dw, DeviceOut dbias,
                          bool accumulate_dx, bool accumulate_dw) override {
    if (recording())
      keep(vk::matmul_nt_backward(*seq_, at(x), n, matrix(w), at(dy), maybe_at(dx), maybe_at(dw), maybe_at(dbias), accumulate_dx,
                                  accumulate_dw));
  }
  void rms_norm_backward(DeviceIn x, const float* w, DeviceIn dy, int64_t n, int64_t d, float eps, DeviceOut dx, DeviceOut dw) override {
    if (recording())
      keep(vk::rms_norm_backward(*seq_, at(x), *vector(w), at(dy), n, d, eps, maybe_at(dx), maybe_at(dw),
                                 scratch("rms_norm_backward.rstd", n)));
  }
  void rope_backward(DeviceOut dx, int64_t n, int64_t n_heads, int64_t head_dim, DeviceIn cos, DeviceIn sin) override {
    if (recording()) keep(vk::rope_apply(*seq_, at(dx), n, n_heads, head_dim, at(cos), at(sin), /*inverse=*/true));
  }
  void swiglu_backward(DeviceIn gate, DeviceIn up, DeviceIn dout, int64_t count, DeviceOut dgate, DeviceOut dup) override {
    if (recording()) keep(vk::swiglu_backward(*seq_, at(gate), at(up), at(dout), count, at(dgate), at(dup)));
  }
  void embedding_backward(DevicePtr<const int32_t> ids, int64_t n, DeviceIn dy, int64_t cols, DeviceOut dtable) override {
    if (recording()) keep(vk::embedding_backward(*seq_, at(ids), n, at(dy), cols, at(dtable)));
  }
  void attention_backward(const AttentionShape& s, DeviceIn q, DeviceIn k, DeviceIn v, DevicePtr<const uint8_t> valid, DeviceIn out,
                          DeviceIn dout, DeviceOut dq, DeviceOut dk, DeviceOut dv) override {
    if (!recording()) return;
    vk::Buffer& stats = scratch("attention_backward.stats", s.n_batch * s.n_seq * s.n_head * 3);
    keep(vk::attention_backward(*seq_, {s.n_batch, s.n_seq, s.n_head, s.n_head_kv, s.head_dim}, at(q), at(k), at(v),
                                valid ? &at(valid) : nullptr, at(out), at(dout), at(dq), at(dk), at(dv), stats));
  }
  void cross_entropy(DeviceIn logits, DevicePtr<const int32_t> targets, DeviceIn weights, int64_t n, int64_t n_vocab, DeviceOut dlogits,
                     DeviceOut ce, DeviceOut loss) override {
    if (!recording()) return;
    vk::Buffer& wce = scratch("cross_entropy.wce", n);
    keep(vk::cross_entropy(*seq_, at(logits), at(targets), at(weights), n, n_vocab, maybe_at(dlogits), maybe_at(ce), wce));
    if (recording())
      keep(vk::reduce_sum(*seq_, wce, 0, n, /*squares=*/false, scratch("reduce.partials", vk::reduce_partials(n)), at(loss)));
  }
  void reduce(DeviceIn x, int64_t n, bool squares, DeviceOut out, int64_t out_index) override {
    if (recording())
      keep(vk::reduce_sum(*seq_, at(x), 0, n, squares, scratch("reduce.partials", vk::reduce_partials(n)), at(out), out_index));
  }
  void adamw_update(const AdamWStep& s, DeviceOut p, DeviceIn g, DeviceOut m, DeviceOut v, int64_t n, DeviceIn clip_sumsq,
                    float max_norm) override {
    if (!recording()) return;
    const vk::AdamWScalars scalars{s.decay, s.b1, s.b2, s.one_b1, s.one_b2, s.step_size, s.bc2_sqrt, s.eps, s.grad_scale};
    keep(vk::adamw_update(*seq_, scalars, at(p), at(g), at(m), at(v), n, clip_sumsq ? &at(clip_sumsq) : nullptr, max_norm));
  }

 private:
  // False after an error (the rest of the forward is skipped; finish() returns the error).
  bool recording() const {
    DC_CHECK(seq_.has_value(), "VulkanBackend: an op outside begin() / finish()");
    return status_.ok();
  }
  void keep(Status s) {
    if (status_.ok() && !s.ok()) status_ = std::move(s);
  }
  // The persistent staging buffer `name` of `buffers` of at least `bytes` (grown, never shrunk); nullptr (the
  // error kept) when the device has too little memory.
  vk::Buffer* staging_for(std::unordered_map<std::string, vk::Buffer>& buffers, const char* name, int64_t bytes) {
    vk::Buffer& staging = buffers[name];
    if (staging.bytes() < bytes) {
      staging = vk::Buffer();
      auto grown = rt_->alloc_staging((bytes + 3) / 4 * 4, std::string("the staging buffer of ") + name);
      if (!grown.ok()) {
        keep(grown.status());
        return nullptr;
      }
      staging = std::move(grown).value();
    }
    return &staging;
  }
  // The recorded sequence with the same commands as `seq` (moved to the front of recorded_), or `seq` itself
  // put there (the least recently used beyond kMaxRecorded dropped; a forward has fewer segments).
  vk::Sequence& replayable(vk::Sequence&& seq) {
    auto it = std::find_if(recorded_.begin(), recorded_.end(), [&](const vk::Sequence& s) { return s.same_work(seq); });
    if (it != recorded_.end()) {
      recorded_.splice(recorded_.begin(), recorded_, it);
    } else {
      recorded_.push_front(std::move(seq));
      if (recorded_.size() > kMaxRecorded) recorded_.pop_back();
    }
    return recorded_.front();
  }
  // A free index of table_ (table_mutex_ held).
  size_t new_slot() {
    if (free_slots_.empty()) {
      table_.push_back(nullptr);
      return table_.size() - 1;
    }
    const size_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  // The buffer at device pointer p and p's byte offset into it; a null buffer for a host pointer passed as an
  // operand, another device's or freed memory.
  std::pair<vk::Buffer*, int64_t> lookup_at(DevicePtr<const void> p) {
    const uint64_t address = p.handle();
    const uint64_t slot = (address >> kAddressShift) - 1, offset = address & ((uint64_t{1} << kAddressShift) - 1);
    const std::lock_guard<std::mutex> guard(table_mutex_);
    if (address >> kAddressShift == 0 || slot >= table_.size()) return {nullptr, 0};
    return {table_[slot], static_cast<int64_t>(offset)};
  }
  // The buffer at p when p is its start; nullptr otherwise (an offset into a buffer too).
  vk::Buffer* lookup(DevicePtr<const void> p) {
    const auto [buffer, offset] = lookup_at(p);
    return offset == 0 ? buffer : nullptr;
  }
  Status not_mine() const {
    return invalid_argument("vulkan: an operand is not the start of one of " + name() +
                            "'s buffers (a host pointer, another device's, or an offset into a buffer)");
  }
  // lookup(p), or (the error kept) an empty buffer, which every kernel refuses.
  vk::Buffer& at(DevicePtr<const void> p) {
    vk::Buffer* b = lookup(p);
    if (b == nullptr) keep(not_mine());
    return b != nullptr ? *b : invalid_;
  }
  // The buffer p points into, and in *elements where p starts in it, in elements of `element_bytes` (the
  // per-part operands of a forward of parts); an empty buffer (the error kept) as at() when p is not in one of
  // this device's buffers or not on an element's boundary.
  vk::Buffer& at(DevicePtr<const void> p, int64_t element_bytes, int64_t* elements) {
    const auto [buffer, offset] = lookup_at(p);
    *elements = offset / element_bytes;
    if (buffer != nullptr && offset % element_bytes == 0) return *buffer;
    keep(buffer == nullptr ? not_mine()
                           : invalid_argument("vulkan: an operand starts " + std::to_string(offset) + " bytes into a buffer, not on a " +
                                              std::to_string(element_bytes) + "-byte element"));
    return invalid_;
  }
  // at(p) for an operand an op may go without (null: none).
  vk::Buffer* maybe_at(DevicePtr<const void> p) { return p ? &at(p) : nullptr; }
  // The named forward buffer `name` of at least `floats` floats: a kernel's scratch (invalid_ after an error).
  vk::Buffer& scratch(const char* name, int64_t floats) {
    const DevicePtr<void> p = alloc(name, floats * 4);
    return p ? at(p) : invalid_;
  }
  const vk::DeviceMatrix& matrix(const WeightView& w) const {
    auto it = matrices_.find(w.data);
    DC_CHECK(it != matrices_.end(), "VulkanBackend: a weight matrix that was never uploaded (Model::to_device)");
    return it->second;
  }
  const vk::Buffer* vector(const float* v) const {
    if (v == nullptr) return nullptr;
    auto it = vectors_.find(v);
    DC_CHECK(it != vectors_.end(), "VulkanBackend: a norm weight or bias that was never uploaded (Model::to_device)");
    return &it->second;
  }

  std::unique_ptr<vk::Runtime> rt_;  // first member: destroyed last
  std::mutex mutex_;
  std::unordered_map<const void*, vk::DeviceMatrix> matrices_;  // by the host view's data pointer
  std::unordered_map<const float*, vk::Buffer> vectors_;        // by the host f32 pointer
  int64_t weight_bytes_ = 0;
  bool matrix_units_ = false;  // set_matrix_units
  static constexpr int64_t kSplitScratchBytes = int64_t{32} << 20;
  vk::Buffer split_scratch_;
  int64_t runs_ = 0;  // finish() calls
  double begun_ms_ = 0;    // thread_cpu_ms() at the last begin()
  double collect_ms_ = 0;  // DeviceCounters::collect_ms
  std::mutex table_mutex_;                          // table_, owned_, free_slots_, released_
  std::vector<vk::Buffer*> table_;                  // DevicePtr handle (slot + 1) << 40 → buffer (null: free)
  std::vector<size_t> free_slots_, released_;
  std::unordered_map<size_t, vk::Buffer> owned_;    // allocate()'s buffers, by slot
  std::unordered_map<const void*, size_t> weight_slots_;  // weight_memory's slots, by the host data pointer
  std::deque<vk::Buffer> arena_;                    // the forward's named buffers
  std::unordered_map<std::string, size_t> slots_;  // name → slot
  vk::Buffer invalid_;                              // empty: what at() gives for a pointer not of this device
  std::unordered_map<std::string, vk::Buffer> staging_in_, staging_out_;  // copy_in's and copy_out's, by name
  struct Out {
    std::string name;
    const vk::Buffer* staging;
    void* host;
    int64_t bytes;
  };
  std::vector<Out> outs_;             // the copy_outs of the forward being collected, read after its run
  std::deque<vk::Buffer> transient_;  // their staging buffers above kKeptOutBytes, and named buffers grown
                                      // after a command bound them (alloc), freed after the run
  std::unordered_set<size_t> named_this_forward_;  // the slots of the named buffers alloc() handed out since begin()
  std::optional<vk::Sequence> seq_;                // the forward's segment being collected
  std::vector<vk::Sequence> segments_;             // its segments collected before it
  std::list<vk::Sequence> recorded_;               // recorded for replay, the last run first
  Status status_;                                  // the first error since begin()
};

VulkanMemory::~VulkanMemory() { owner_->release(slot_); }

}  // namespace

Result<std::unique_ptr<DeviceBackend>> open_vulkan_backend(int index) {
  DC_ASSIGN_OR_RETURN(std::unique_ptr<vk::Runtime> rt, vk::Runtime::open(index));
  return std::unique_ptr<DeviceBackend>(new VulkanBackend(std::move(rt)));
}

}  // namespace dc
