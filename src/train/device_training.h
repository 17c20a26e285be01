// DeviceTraining: the state a trainer keeps on a device (a Trainer or GrpoTrainer created with a device Context)
// and the steps both run there. The f32 master weights are the device's copy of the model's weights
// (Model::to_device, updated in place by AdamW through DeviceBackend::weight_memory; owned by the trainer and found
// by tensor index, not host address); the gradients and both Adam moments are DeviceParams. DeviceLossRows holds
// the loss rows' hidden states and runs the lm_head, the cross-entropy and the head's backward over them in chunks
// of rows, one chunk's logits on the device at a time (the SFT loss, the Coupled-GRPO loss and its log-probs).
// What crosses to the host per step: the metrics only. The optimizer step
// is one submission: each tensor's Σ g², their sum, and AdamW, which skips a non-finite sum and clips by it there
// (ops/adamw.h adamw_update's clip_sumsq); the sum comes back as the gradient norm after the step has run.
// Checkpoints download the weights and moments into the OptimizerCore first. Full fine-tuning, f32 (no LoRA or
// mixed precision on a device yet: the trainers refuse them).
// Data parallel (a sharded OptimizerCore, one device per rank: api/train_shared.h open_rank_device): each rank
// accumulates its micro-batches' gradients on its device and keeps the Adam moments of its shard there (the core
// hands them over: OptimizerCore::hand_state_to_device), cut at the tensors' edges into parts. The step downloads
// the gradients once into a host staging buffer and reduce-scatters them over the ranks (ZeRO-2's rank order,
// OptimizerCore::step_local_grads); the host computes the global norm over all shards; the rank uploads its
// reduced shard, the device runs AdamW over it (clipped by that norm), the updated shard comes back for the
// all-gather of the f32 weights, which go up once. Per step and rank, with N parameters over R ranks: 4·N + 4·N/R
// bytes down and 4·N + 4·N/R up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "lora/trainable.h"
#include "model/device_params.h"
#include "model/transformer.h"
#include "train/optimizer_core.h"

namespace dc {
class DeviceMemory;
}

namespace dc::train {

// What a trainer on a device changes: the precision to f32 (the device's backward has no bf16 matrix-unit path
// yet; said in a note).
void set_device_training_precision(const Context& ctx, MatmulPrecision* precision);

// The loss rows' device memory, grown to the largest batch so far, never shrunk: hidden [n_out, n_embd] (what
// Model::forward_hidden writes; after a backward pass, its gradient) and one chunk's buffers: its hidden rows and
// their gradient [chunk, n_embd] and its logits [chunk, n_vocab] (then their gradient). A chunk is chunk_rows()
// rows (the last one fewer): the device holds one chunk's logits, not the n_out rows' (5 GB at 8192 rows of the
// 152k vocabulary; 223 MiB in a chunk of 384).
class DeviceLossRows {
 public:
  // The lm_head's logits of one chunk in bytes at most (the default chunk: as many rows as fit, a multiple of 64).
  static constexpr int64_t kChunkLogitsBytes = int64_t{256} << 20;
  // The default rows of a chunk for a vocabulary of n_vocab: kChunkLogitsBytes of f32 logits rounded down to a
  // multiple of 64 rows (the GEMMs' tile), at least 64: 384 rows at 152,064 (the dW product's K of 384 keeps the
  // matrix units busy), 16384 at 4096.
  static int64_t default_chunk_rows(int64_t n_vocab);

  DeviceLossRows();
  ~DeviceLossRows();
  DeviceLossRows(DeviceLossRows&&) noexcept;
  DeviceLossRows& operator=(DeviceLossRows&&) noexcept;

  // The rows of a chunk from now on (the tests' few rows, so that a tiny batch runs several chunks and a tail);
  // 0: default_chunk_rows of the model's vocabulary.
  void set_chunk_rows(int64_t rows) { forced_chunk_rows_ = rows; }
  int64_t chunk_rows(const ModelConfig& config) const;
  // Room for n_out rows (at least 1) of `config` and one chunk. Errors: the device's out of memory
  // (kResourceExhausted).
  Status reserve(const Context& ctx, const ModelConfig& config, int64_t n_out);
  float* hidden() const;  // [n_out, E] device operand

  // The head's backward in head_and_cross_entropy: the lm_head's gradient dw [n_vocab, n_embd] (a device operand;
  // null: the head frozen, a LoRA run), written with `write` kOverwrite by the first chunk, added by the others.
  struct HeadGrad {
    float* dw = nullptr;
    GradWrite write = GradWrite::kAdd;
  };
  // One submission over the n_out rows of hidden() (reserve()d), chunk by chunk of chunk_rows(): the chunk's
  // logits = hidden·outputᵀ (Model::lm_head), cross_entropy_rows against targets weighted by weights, and with
  // `backward` (may be null) dlogits in place and the head's backward (Model::lm_head_backward): the chunk's rows
  // of hidden() overwritten by ∂loss/∂hidden (the start of Model::backward(BackwardFrom::hidden(hidden()))) and the
  // lm_head's gradient as backward->dw says. Downloads each row's unweighted CE into ce_host[n_out] (may be null)
  // and Σ weights·CE into *loss_host (may be null): the chunks' f32 sums added in order on the device. targets and
  // weights are host arrays [n_out]. `then` (may be empty) records more work into the same submission after the
  // chunks (Model::record_backward from the rows' gradient: the head and the backward one submission); its error
  // is returned. A device context.
  Status head_and_cross_entropy(const Context& ctx, const Model& model, int64_t n_out, const int32_t* targets,
                                const float* weights, const HeadGrad* backward, float* ce_host, float* loss_host,
                                const std::function<Status()>& then = {});

 private:
  std::unique_ptr<DeviceMemory> hidden_, chunk_hidden_, chunk_dhidden_, logits_;
  int64_t hidden_floats_ = 0, chunk_hidden_floats_ = 0, chunk_dhidden_floats_ = 0, logits_floats_ = 0;
  int64_t forced_chunk_rows_ = 0;  // set_chunk_rows's; 0: the default
};

// The batch-sized parts of a device run, for its memory plan: the largest training micro-batch (its forward
// and backward) and, for GRPO, one rollout generation. Upper bounds, so that no step runs out of memory midway.
struct DeviceBatchShape {
  int64_t positions = 0;          // T of the largest training micro-batch: rows × sequence length
  int64_t loss_rows = 0;          // its loss rows at most (the lm_head's and the cross-entropy's rows)
  bool recompute = false;         // gradient checkpointing (--grad-checkpointing)
  int64_t rollout_positions = 0;  // GRPO: one rollout forward's positions, rows × (prompt + completion); 0: none
  int64_t rollout_sampled = 0;    // GRPO: the positions its head samples at most, rows × completion
  int64_t rollout_kv_rows = 0, rollout_kv_seq = 0;  // GRPO: the rollouts' KV cache (the cache modes; 0: none)
  std::string smaller_batch;      // the flags that make a micro-batch smaller, for the refusal ("--batch-size, --seq-len")
};

// What a device run needs of the device's memory, in bytes (f32). For the whole run: the weights (the master
// weights themselves: AdamW updates the device's copy), the gradients, the two Adam moments and a reference model
// (GRPO's KL). For the largest batch (DeviceBatchShape; grown to, then kept): the training activations, the
// forward's and the backward's working buffers, the loss rows' hidden states and one chunk's logits
// (DeviceLossRows), and the rollouts' sampled rows and KV cache. Not counted: kernels' scratch of a fixed size and
// the transfers' staging buffers.
struct DeviceTrainingPlan {
  int64_t weights = 0, gradients = 0, moments = 0, reference = 0;
  int64_t activations = 0, scratch = 0, loss_rows = 0, rollouts = 0;
  int64_t total() const { return weights + gradients + moments + reference + activations + scratch + loss_rows + rollouts; }
  std::string text() const;  // "weights X MiB, gradients Y MiB, ...; Z MiB in all"
};

// A rank's shard of a sharded full fine-tune on its device: the values its Adam moments cover, and those of its
// parts of the tensors it shares with the ranks beside it (AdamW's own f32 copies of those parts).
struct DeviceShard {
  int64_t values = 0, edge_values = 0;
};

// The plan of training `model` on a device: with `optimizer` the moments (with `shard` those of a rank's shard),
// with `reference` a second model of the same size, and `batch`'s parts. With `lora` (a LoRA run's adapters) the model is a frozen base: its weights as
// stored, plus the adapters; the gradients, moments and a reference (GRPO's: the reference adapters over the same
// base) are the adapters' only; the activations keep each adapter's u and the working buffers its products'.
DeviceTrainingPlan plan_device_training(const Model& model, bool optimizer, bool reference, const DeviceBatchShape& batch,
                                        const LoraParams* lora = nullptr, const DeviceShard* shard = nullptr);
// Ok when `plan` fits `device_bytes`; else kResourceExhausted naming `device`, the sizes and what would make the run
// fit: --grad-checkpointing (with the activations it would leave), a smaller micro-batch (batch.smaller_batch),
// more ranks when the moments are on the device (mpirun: each rank's device keeps its shard's; a full fine-tune),
// LoRA adapters (a full fine-tune), or --device cpu.
Status check_device_plan(const DeviceTrainingPlan& plan, const Model& model, bool optimizer, bool reference,
                         const DeviceBatchShape& batch, int64_t device_bytes, const std::string& device,
                         const LoraParams* lora = nullptr, const DeviceShard* shard = nullptr);

// One tensor a device optimizer step updates: weights p, gradient g and moments m, v [n] (device operands), and
// its weight decay.
struct DeviceAdamwTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  double weight_decay;
};
// A device optimizer step (DeviceTraining's and DeviceLoraTraining's) in one submission: each tensor's Σ g² and
// their sum (f32, a fixed order), then, for a finite `loss`, AdamW at step steps_done + 1 of `options`' schedule
// with the gradients clipped to its max_grad_norm by that sum (a non-finite sum skips the update, decided on the
// device). Returns the step's stats for the core's count_step: the rate, the norm (the sum read back after the
// step has run) and the skip cause (the same Σ, the same rule as the CPU's).
Result<OptimizerStepStats> device_adamw_step(const Context& ctx, const std::vector<DeviceAdamwTensor>& tensors,
                                             const OptimizerOptions& options, int64_t steps_done, double loss);

class DeviceTraining {
 public:
  // Uploads `model`'s weights (f32: a model over the master weights) to ctx's device (a device context) and
  // allocates zero gradients; with `core`, also its moments (the saved ones when it has resumed; a sharded core's
  // of its shard, which the core hands over, with its gradient buffers: a host staging buffer of the gradients
  // instead), else gradients only (step() is then refused: grpo-loss). Errors: the device's out of memory (naming
  // the tensor), weights not f32. The trainer owns its weights' device copies and finds them by tensor index (visit_tensors
  // order): whatever copy the backend held from the same host addresses (e.g. a destroyed trainer's, whose host
  // memory the allocator handed out again) is dropped first and the model's values uploaded, and the copies are
  // dropped again when the trainer is destroyed (which must come before the backend's destruction).
  // Before any upload the plan (with `reference`: a second model of the same size to come; `batch`: the largest
  // micro-batch and rollout to come) is logged and checked against the device's memory: a run that would not
  // fit is refused (kResourceExhausted, check_device_plan) with its sizes and what would make it fit.
  static Result<std::unique_ptr<DeviceTraining>> start(const Context& ctx, const Model& model, OptimizerCore* core,
                                                       const DeviceBatchShape& batch, bool reference = false);
  ~DeviceTraining();

  DeviceParams& grads() { return grads_; }
  DeviceLossRows& rows() { return rows_; }
  // OptimizerCore::step on the device (an unsharded core in f32), in one submission: the global Σ g² from each
  // tensor's (f32 sums in a fixed order), then AdamW at learning_rate(core's schedule) scaled by clip_coefficient
  // of that norm, computed on the device; a non-finite loss (known on the host) or norm (decided on the device)
  // skips the update. The Σ is read back after the step as the stats' grad_norm; the step is counted in `core`.
  // A sharded core (every rank calls it): the gradients downloaded, OptimizerCore::step_local_grads with AdamW of
  // the shard on the device (the host's norm and clip: update_shard), and the all-gathered weights uploaded (not
  // after a skipped step).
  Result<OptimizerStepStats> step(const Context& ctx, OptimizerCore& core, double loss);
  // Downloads the weights into core's master weights and, when started with a core, the moments (before
  // OptimizerCore::save, or a host-side mix of the weights). Sharded: the shard's moments
  // (OptimizerCore::restore_shard_moments; the core's weights are the device's already).
  Status sync_to_host(const Context& ctx, OptimizerCore& core) const;

  // A second model on the device (GRPO's reference model, of this model's config), owned as the first: stale
  // copies at its host addresses dropped, its weights uploaded (Model::to_device) and found by tensor index.
  Status upload_reference(const Context& ctx, const Model& reference);
  // Copies host's values (a ModelParams of the config; e.g. the reference after its sync mixed it on the host)
  // into the reference's device copy, tensor by tensor in index order. Errors: no upload_reference before, or
  // the device's (kInvalidArgument / the backend's).
  Status refresh_reference(const Context& ctx, const ModelParams& host) const;

 private:
  DeviceTraining() = default;
  // Makes `model`'s weights this trainer's on ctx's device: drops the copies the backend holds at their host
  // addresses, uploads them and sets *spans to their device copies (visit_tensors order).
  Status adopt(const Context& ctx, const Model& model, ModelSpans* spans);
  // Copies host's tensors (a ModelParams of the config) into the device copies `spans` (visit_tensors order).
  Status upload_into(const Context& ctx, const ModelSpans& spans, const ModelParams& host) const;
  Result<OptimizerStepStats> step_sharded(const Context& ctx, OptimizerCore& core, double loss);
  // Sharded: this rank's shard cut at the tensors' edges. Each part's weights are the tensor's device copy when the
  // part is the whole tensor, else a copy of the part's own (kept equal to the tensor's: AdamW updates it, the
  // all-gather brings the tensor its values); p, m, v are device operands [end − begin].
  struct ShardPart {
    size_t tensor;         // its index (visit_tensors order)
    int64_t begin, end;    // the flat values it covers
    bool whole;            // the whole tensor
    float *p, *m, *v;
    double weight_decay;   // as adamw_shard's
  };
  // The parts of core's shard (ranges and decay; no device memory yet).
  static std::vector<ShardPart> shard_parts(const OptimizerCore& core);
  // Allocates the parts' moments and own weight copies and uploads core's handed-over moments and weights.
  Status start_shard(const Context& ctx, OptimizerCore& core);
  // AdamW of the shard on the device (OptimizerCore::ShardUpdate): g [shard size] the reduced gradients, uploaded
  // part by part; the updated values downloaded into core's params() at the shard.
  Status update_shard(const Context& ctx, OptimizerCore& core, const float* g, float grad_scale, double lr);
  // The parts' moments downloaded and handed back to core (OptimizerCore::restore_shard_moments), before a save.
  Status download_shard_moments(const Context& ctx, OptimizerCore& core) const;
  ModelConfig config_;
  DeviceBackend* backend_ = nullptr;  // whose copies hosts_ names, dropped on destruction
  std::vector<const void*> hosts_;    // the host addresses of the adopted weights: the backend's keys, never read
  ModelSpans params_;     // the device's weights, writable device operands (visit_tensors order)
  ModelSpans reference_;  // upload_reference's (empty before)
  DeviceParams grads_, m_, v_;
  bool moments_ = false;  // the Adam moments of the whole model on the device (an unsharded core)
  bool sharded_ = false;  // a sharded core: the shard's moments in parts_, staging_ the gradients' way to the host
  ModelParams staging_;   // sharded: [n values] this rank's gradients, downloaded once per step
  std::vector<ShardPart> parts_;
  std::vector<std::unique_ptr<DeviceMemory>> shard_memory_;  // the parts' moments and own weight copies
  DeviceLossRows rows_;
};

}  // namespace dc::train
