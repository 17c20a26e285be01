// Model: a loaded Dream / DiffuCoder checkpoint and its forward pass, written once against the ops API.
// Inference and training share this forward; the backward (transformer_backward.cc) runs it in reverse.
#pragma once

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/context.h"
#include "core/pages.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "model/activations.h"
#include "model/kv_cache.h"
#include "model/lora_weights.h"
#include "model/weights.h"
#include "ops/matmul.h"
#include "types/forward_batch.h"
#include "types/model_config.h"

namespace dc {

// Receives named intermediates of the forward ("embd", "L3.attn_norm", "L3.q", ..., "output_norm")
// with their row-major shape. For debugging: finds the first layer that diverges from a reference.
using ForwardObserver =
    std::function<void(const std::string& name, const float* data, const std::vector<int64_t>& shape)>;

// What Model::pack_weights did with the packed-weight cache (model/weight_cache.h).
struct WeightCacheReport {
  enum Outcome { kNotUsed, kLoaded, kWriting };
  Outcome outcome = kNotUsed;  // kNotUsed: no cache path, nothing to pack, or no checkpoint files
  std::string path;
  std::string note;            // why an existing cache was not used (stale or damaged), "" otherwise
  int64_t bytes = 0;           // the packed buffers' total size
};

// Where Model::backward starts: at the logits (dlogits [n_out, n_vocab] = ∂loss/∂logits of the rows
// batch.out_rows: the lm_head's backward runs inside), or after the lm_head (dhidden [n_out, n_embd] = ∂loss/∂
// the lm_head's input, from lm_head_backward: a caller that ran the head in chunks of rows, whose lm_head
// gradient is then its own, written or added into grads.output by lm_head_backward as `write` says).
struct BackwardFrom {
  BackwardFrom(const float* dlogits) : dlogits(dlogits) {}  // NOLINT(google-explicit-constructor): the usual start
  static BackwardFrom hidden(const float* dhidden) {
    BackwardFrom b(nullptr);
    b.dhidden = dhidden;
    return b;
  }
  const float* dlogits = nullptr;  // [n_out, n_vocab]
  const float* dhidden = nullptr;  // [n_out, n_embd]
};

class Model {
 public:
  ~Model();  // waits for a packed-weight cache still being written (wait_for_weight_cache)
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Opens the checkpoint directory (config.json + safetensors, memory-mapped) and checks every tensor
  // against the config. Weights stay in their stored dtype.
  static Result<std::unique_ptr<Model>> load(const std::string& dir);

  // A model over weights that already live in memory (synthetic benchmark models, converted
  // weights); `storage` owns the memory the views point into and is kept alive by the model.
  // Precondition: `weights` matches `config` (e.g. filled through visit_weights).
  static std::unique_ptr<Model> from_weights(ModelConfig config, ModelWeights weights,
                                             std::shared_ptr<const void> storage);

  const ModelConfig& config() const { return config_; }
  // The checkpoint the weights were loaded from; nullptr for from_weights models.
  const Checkpoint* checkpoint() const { return checkpoint_.get(); }
  const ModelWeights& weights() const { return weights_; }

  // Re-lays every matrix of the layers and an untied lm_head that ctx's kernels read faster that way
  // (worth_packing in ops/matmul.h: bf16 at MatmulPrecision::kBF16, q8 / q4) in the kPanels layout
  // (ops/weight.h), the operand layout of the fast GEMMs, so that no forward re-packs them;
  // each chunk's row-major pages are released once packed (release_pages) when they are a mapped
  // checkpoint's or storage only this model owns, so resident memory stays about the same. Every kernel still accepts the packed views, with the same results. For
  // MatmulPrecision::kBF16 on a CPU with AVX512_BF16 (Engine calls it). Idempotent. Not thread-safe:
  // call before the model is used from other threads. Fails (with the model unchanged from the failing
  // matrix on) only when memory runs out.
  Status pack_weights(const Context& ctx);
  // pack_weights with the packed copies kept in the file `cache_path` (model/weight_cache.h; "" = no
  // cache). A cache that matches this checkpoint's files (name, size, mtime), the precision and the
  // packing format, and whose every checksum holds, is mapped instead of packing (the model reads it in
  // place). Otherwise the model packs as pack_weights does and a background thread (low priority)
  // writes the cache, atomically; a stale or damaged cache is thereby replaced, never used. *report
  // (may be null) says which happened. Same results either way, bit for bit.
  Status pack_weights(const Context& ctx, const std::string& cache_path, WeightCacheReport* report);
  // Blocks until the cache writer started by pack_weights finished; its status (ok when none ran).
  Status wait_for_weight_cache();

  // Unmerged LoRA adapters every forward of this model adds when its batch names none (ForwardBatch::lora
  // null): a model over a frozen base's weights that acts as base + adapters wherever it is passed (GRPO's
  // policy and reference models in the rollouts and the scoring passes). Not owned; null: none. Set before the
  // model is used from other threads.
  void set_lora(const LoraWeights* lora) { lora_ = lora; }
  const LoraWeights* lora() const { return lora_; }

  // Uploads every weight to ctx's device (ctx.backend), once, in its stored layout; call before a forward
  // with that context (so before pack_weights, whose kPanels copies are the CPU's layout). Errors: the
  // weights larger than the device's memory, or its out-of-memory (kResourceExhausted), naming the sizes.
  Status to_device(const Context& ctx) const;
  // What to_device uploads, in bytes: each matrix at its stored size (q4: half a byte a value; scale tables not
  // counted), the f32 vectors.
  int64_t device_weight_bytes() const;
  // Uploads each A and B of unmerged adapters to ctx's device as f32 weights named by their host memory, as
  // to_device does the weights (a no-op for those already there): a device forward that adds them calls it.
  // Changes made on the host later are not seen (a device trainer updates the device copies in place,
  // DeviceBackend::weight_memory; drop_weight forgets a copy). Errors: add_matrix's, naming the tensor.
  Status lora_to_device(const Context& ctx, const LoraWeights& lora) const;

  // Runs the bidirectional transformer over batch.tokens and writes the (unshifted) logits of the rows
  // batch.out_rows to logits[n_out, n_vocab], f32: forward_hidden, then lm_head in chunks of
  // kHeadChunkRows (training mode: one product). With batch.cache_op kRefresh it also stores every
  // layer's K/V in batch.cache; with kUse it computes only the positions of batch.window (see CacheOp in
  // forward_batch.h). Checks the batch (ids, positions, rows in range and in the window, window and cache
  // consistent) and returns invalid_argument naming the bad field; when memory runs out (workspace,
  // kernel scratch, the KV cache) it returns resource_exhausted, and batch.cache is then left unfilled.
  // The activations live in ctx.workspace when set (else in this call's own buffers). Thread-safe for
  // concurrent calls that share neither a cache nor a workspace (a shared pool serialises their
  // parallel sections).
  //
  // Training mode (train != nullptr; the whole sequence, no cache): also writes into *train the
  // activations backward() needs (model/activations.h), in ctx's memory (a device's on a device: the
  // forward's logits still come back to `logits`). Same results as without on the CPU.
  Status forward(const Context& ctx, const ForwardBatch& batch, float* logits,
                 const ForwardObserver* observer = nullptr, Activations* train = nullptr) const;

  // Bytes of the buffers a forward holds per computed position (forward_body's h, a, q, attn, k, v, gate and up
  // in f32, its token and RoPE tables): what a device's forward memory grows by per position (a server's budget).
  int64_t forward_bytes_per_position() const;
  // Bytes of the buffers backward() holds on a device for T positions and n_out loss rows: the activations'
  // gradients (with recompute two more [T, E] for the recomputed layer; `from_hidden`: started after the lm_head,
  // BackwardFrom::hidden, one [n_out, E] less), the attention's per-row statistics and the forward's inputs it
  // uploads. With Activations::bytes_for and the forward's, a device trainer's memory plan.
  int64_t backward_bytes(int64_t T, int64_t n_out, bool recompute, bool from_hidden = false) const;

  // The rows the lm_head computes in one product by default (forward(), the engine's HeadSampler): a
  // [kHeadChunkRows, n_vocab] f32 block (39 MB at the 152k vocabulary) instead of [n_out, n_vocab].
  static constexpr int64_t kHeadChunkRows = 64;

  // forward() without the lm_head: writes the final-normed hidden rows of batch.out_rows to hidden[n_out,
  // n_embd] (the lm_head's input), where ctx's ops read it: host memory on the CPU, a device pointer on a
  // device (DeviceMemory of the caller's; the rows stay there). Same checks, errors and thread safety as
  // forward(), and its training mode (`train`): a device trainer runs the lm_head and the loss on the rows
  // where they are (train/device_training.h DeviceLossRows).
  Status forward_hidden(const Context& ctx, const ForwardBatch& batch, float* hidden, Activations* train = nullptr) const;
  // forward_hidden over several parts in one forward (the server's requests with a KV cache, a step each):
  // each part is a batch of its own (its rows, canvas, window, cache and cache op; the same LoRA adapters in
  // every part), the token gather, embedding, norms, projections and MLP run over all parts' computed
  // positions stacked (the weights read once), and per part RoPE, the store into its cache and the attention
  // over its cache and window. hidden[Σ n_out, n_embd]: part p's out rows after those of parts < p, each
  // the values its own forward_hidden gives: bit for bit with the reference kernels (every stacked op is
  // row-wise), within rounding with the fast ones (the matmul picks its few-rows or packed path by the
  // stacked row count: 1e-7 to 8e-7 relative measured, tests/model/kv_cache_test.cc). Checks every part as
  // forward_hidden (errors name the part); no training mode. On a device the same, in one submission: the
  // per-part kernels (RoPE with the cache store, attention) read and write the part's rows inside the stacked
  // buffers at offsets (push constants), each part's padding mask inside one device copy of them all
  // (tests/model/vulkan/parts_vulkan_test.cc: within 1e-5 relative of each part alone and of the CPU's).
  Status forward_hidden_parts(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden) const;

  // forward_hidden of a device step whose caller runs it together with what it records next (the lm_head
  // and the sampling of the same step: one submission, engine/device_head_sampler.h): records the forward
  // into ctx.backend's open forward — the caller holds its lock() and has called begin(); its finish() runs
  // it. Same checks and errors as forward_hidden (a device context only); when finish() fails, the caller
  // marks a refreshed batch.cache unfilled (set_filled(false)), as forward_hidden does. Over parts as
  // forward_hidden_parts (one part: forward_hidden).
  Status record_hidden(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden) const;
  // The checks of forward / forward_hidden (the batch, its cache's device, the LoRA adapters), running nothing.
  Status check_forward(const Context& ctx, const ForwardBatch& batch) const;
  // The checks of forward_hidden_parts (each part's, naming it, and the parts together), running nothing.
  Status check_forward(const Context& ctx, std::span<const ForwardBatch> parts) const;

  // The lm_head: logits[n, n_vocab] = hidden[n, n_embd] · outputᵀ, one matmul_nt per chunk of chunk_rows
  // rows counted from hidden's first row. The fast kernels' summation order depends on a product's row
  // count, so a row's logits are a function of its row, its index modulo chunk_rows and the rows of its
  // chunk's size: callers that must agree bit for bit (forward() and the engine's HeadSampler) use the
  // same chunk_rows from the same first row. Overwrites logits. Throws std::bad_alloc (kernel scratch).
  void lm_head(const Context& ctx, const float* hidden, int64_t n, float* logits,
               int64_t chunk_rows = kHeadChunkRows) const;
  // The lm_head's backward over n rows (model/transformer_backward.cc): dhidden[n, n_embd] = dlogits[n, n_vocab]
  // · output (overwritten) and, with dw non-null, dw[n_vocab, n_embd] (+)= dlogitsᵀ · hidden[n, n_embd] (added,
  // or overwritten with `write` kOverwrite; tied embeddings: dw is the embedding table's gradient). One product
  // each; on a device every operand is the device's and each must start a buffer. What backward() runs on its
  // dlogits; a caller that runs the head in chunks of rows calls it per chunk, then backward(BackwardFrom::hidden).
  // `wt`: the mixed-precision wᵀ of the output matrix as backward()'s `transposed` holds it (may be null).
  void lm_head_backward(const Context& ctx, const float* hidden, int64_t n, const float* dlogits, float* dhidden,
                        float* dw, GradWrite write, const WeightView* wt = nullptr) const;

  // Backward of a training-mode forward (model/transformer_backward.cc): given dlogits[n_out, n_vocab]
  // = ∂loss/∂logits of the rows batch.out_rows (or, BackwardFrom::hidden, the gradient after the lm_head: the
  // lm_head's own gradient is then the caller's, every other one as below), ADDS ∂loss/∂w of every weight into
  // `grads` (the caller zeroes it; writable f32 spans shaped like the weights, e.g. ModelParams::spans(), see
  // model/params.h),
  // or with `write` kOverwrite writes them (grads may hold anything before; the same values bit for bit:
  // the dW products overwrite, the rest is zeroed first — the norm weights and an untied embedding table,
  // whose gradient is a scatter). Needs dense weights. With tied embeddings the lm_head
  // gradient lands in grads.tok_embd. With acts.recompute each layer's forward is run again from its
  // saved input into acts.scratch first (same gradients, bit for bit). Out of memory: resource_exhausted
  // (grads then partly written). grads.on_layer_done, when set, is called as each layer's gradients are
  // complete, and grads.on_head_done once the lm_head's and the final norm's are, before any layer's
  // (their errors returned). Not thread-safe against other calls writing the same grads. Mixed
  // precision (bf16_backward(ctx)): `transposed` (may be null) holds every matrix's wᵀ in bf16
  // (MixedPrecisionWeights::transposed()) for the dx products; an empty view there: made per call.
  Status backward(const Context& ctx, Activations& acts, BackwardFrom from, const ModelSpans& grads,
                  const ModelWeights* transposed = nullptr, GradWrite write = GradWrite::kAdd) const;
  // backward() of a training-mode forward that ran with batch.lora = &lora, the base frozen: ADDS the
  // gradients of the adapters' A and B into `grads` (shaped as lora's matrices) and computes none of the
  // base's weights (so the base may be quantized: its dx products read it dequantized). `lora` must be the
  // forward's, dropout key included (the backward draws the same mask). On a device (the forward's, which
  // uploaded the adapters) `grads` are device operands (train/device_lora.h) and the products are f32.
  // Errors as backward()'s.
  Status backward_lora(const Context& ctx, Activations& acts, BackwardFrom from, const LoraWeights& lora,
                       const LoraGrads& grads, const ModelWeights* transposed = nullptr) const;
  // backward() and backward_lora() of a device step whose caller runs them together with what it recorded before
  // (a device trainer's chunked head: train/device_training.h DeviceLossRows): records the backward into
  // ctx.backend's open submission — the caller holds its lock() and has called begin(); its finish() runs it.
  // Same checks and errors (a device context only).
  Status record_backward(const Context& ctx, Activations& acts, BackwardFrom from, const ModelSpans& grads,
                         GradWrite write) const;
  Status record_backward_lora(const Context& ctx, Activations& acts, BackwardFrom from, const LoraWeights& lora,
                              const LoraGrads& grads) const;

 private:
  Model(std::shared_ptr<const Checkpoint> checkpoint, std::shared_ptr<const void> storage, ModelConfig config,
        ModelWeights weights)
      : checkpoint_(std::move(checkpoint)),
        storage_(std::move(storage)),
        config_(std::move(config)),
        weights_(std::move(weights)) {}

  Status check_batch(const ForwardBatch& batch) const;
  // The parts as a forward runs them (set_lora's adapters where a part names none), once each is checked
  // (check_forward, errors naming the part when there are several) and the parts together: at least one, the
  // same adapters, no KV cache shared.
  Result<std::vector<ForwardBatch>> checked_parts(const Context& ctx, std::span<const ForwardBatch> parts) const;

  struct PackTarget {
    std::string name;  // "layers.3.w_up", "output"
    WeightView* w;
    PanelSizes sizes;
  };
  std::vector<PackTarget> pack_targets(const Context& ctx);

  // forward and forward_hidden: checks the batch, runs forward_body into `hidden` ([n_out, E]; null: the
  // workspace's), then the lm_head into `logits` unless it is null; out of memory → resource_exhausted.
  // Over parts (forward_hidden_parts; one part otherwise), each with set_lora's adapters when it names none.
  Status forward_checked(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden, float* logits,
                         const ForwardObserver* observer, Activations* train) const;
  // forward_checked on a device (ctx.device != kCpu) over its checked parts: records forward_body and the
  // lm_head into the backend, runs them and downloads the logits (forward_hidden: leaves the rows in `hidden`,
  // device memory); training mode keeps the activations in device memory. No observer.
  Status forward_on_device(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden, float* logits,
                           const ForwardObserver* observer, Activations* train) const;
  // The bodies of forward and backward, which may throw std::bad_alloc (the public functions turn it into
  // resource_exhausted).
  // Over parts stacked (forward_hidden_parts, on either device); training mode: one part.
  Status forward_body(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden,
                      const ForwardObserver* observer, Activations* train) const;
  // grads null: a frozen base (backward_lora); lora / lora_grads: the adapters and their gradients, or null.
  Status backward_body(const Context& ctx, Activations& acts, BackwardFrom from, const ModelSpans* grads,
                       const LoraWeights* lora, const LoraGrads* lora_grads, const ModelWeights* transposed,
                       GradWrite write) const;

  // Where one layer's forward over the T = Σ n_batch · window positions of its parts reads and writes.
  struct LayerPass {
    std::span<const ForwardBatch> parts;  // padding mask, window, cache op and cache of each; part p's T_p =
                                          // n_batch · window rows follow those of parts < p in every buffer
    int64_t T;
    const float* cos;           // [T, D/2] RoPE tables
    const float* sin;           // [T, D/2]
    float* h;                   // [T, E] residual stream: the layer's input, overwritten with its output
    float* tmp;                 // [T, E] scratch (o_proj and down_proj outputs); may equal a1 and a2
    const ForwardObserver* observer;
    float* a1 = nullptr;        // [T, E] attn_norm(h)
    float* q = nullptr;         // [T, H*D] after RoPE
    float* k = nullptr;         // [T, Hkv*D] after RoPE (a kRefresh of one part passes the cache's layer)
    float* v = nullptr;         // [T, Hkv*D]
    float* attn = nullptr;      // [T, H*D] attention output
    float* h_mid = nullptr;     // [T, E] copy of the stream after the attention residual, or nullptr
    float* a2 = nullptr;        // [T, E] ffn_norm
    float* gate = nullptr;      // [T, F] before SiLU
    float* up = nullptr;        // [T, F]
    bool kv_in_cache = false;   // k and v are the one part's cache layer (its kRefresh): nothing to store
    float* act = nullptr;       // [T, F] silu(gate)·up; may equal gate
    // Training mode: the activations' u of each LoRA-adapted projection (its dropout on); else null.
    std::array<float*, kLoraTargets>* lora_u = nullptr;
  };
  // Layer il's pre-norm attention block and SwiGLU MLP (the body of forward, and the recomputation of
  // backward with acts.recompute).
  void layer_forward(const Context& ctx, int64_t il, const LayerPass& pass) const;
  // Layer il's RoPE, K/V store and attention of a kUse part whose rows compute their own positions
  // (window_row_begin), one row at a time: q, k, v, attn [n_computed, ·] and cos, sin [n_computed, D/2] are the
  // part's rows (row b's row_width(b) from row_first(b)); row b's K/V go into its cache row at its positions.
  void rows_attention(const Context& ctx, int64_t il, const ForwardBatch& part, float* q, float* k, const float* v,
                      const float* cos, const float* sin, float* attn) const;

  const LoraWeights* lora_ = nullptr;             // set_lora's default adapters
  std::shared_ptr<const Checkpoint> checkpoint_;  // owns the mapped files weights_ points into, or null
  std::shared_ptr<const void> storage_;           // owns in-memory weights (from_weights) or the f32 vectors (load)
  ModelConfig config_;
  ModelWeights weights_;
  std::vector<PageArray<uint8_t>> packed_;  // the kPanels copies (pack_weights)
  std::unique_ptr<MappedFile> packed_file_;  // or the packed-weight cache they were mapped from
  std::thread cache_writer_;                 // writes the cache after a fresh pack
  std::atomic<bool> cache_done_{false};
  std::atomic<int64_t> cache_written_{0};
  int64_t cache_total_ = 0;
  Status cache_write_status_;
};

}  // namespace dc
