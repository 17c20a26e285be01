// OptimizerCore: the training state every trainer drives (the SFT Trainer, Coupled-GRPO): f32 master
// weights, their gradients and both Adam moments (four ModelParams, one contiguous buffer each), global-norm
// clipping, AdamW with a learning-rate schedule, the step count, checkpoints (weights + moments + state,
// atomic, plus the driver's own files) with bit-exact resume, and out_dir/metrics.jsonl.
// Data parallel (a dist::Comm of N > 1 ranks): ZeRO stages 1 and 2 — each rank keeps the Adam moments and
// the reduced gradients of its shard of the flat buffer only (dist::shard_range). The local gradients
// live in a buffer of shared slots (ModelParams::zeros_sharing_slots: the layers share two layers'
// storage, an untied lm_head the embedding table's), reduce-scattered in rank order into the shards' sums
// as the backward completes them, each slot then cleared for its next user: the lm_head and final norm
// (on_head_done), each layer from the last (on_layer_done), and the embedding table at the micro-batch's
// end (end_micro_batch). The reductions overlap the backward: a bucket's reduce-scatter is started
// (Comm::reduce_scatter_add_start) when the backward completes it and finished when the next one starts,
// so layer il's messages travel while the backward computes layer il − 1 (in the other slot); the table's
// is blocking. So every micro-batch reduces all gradients once, in the same order on every rank, and a
// rank holds, besides its shard's sums, two layers' and one table's slot, and the receive buffers of the
// bucket in flight. With several micro-batches per rank (OptimizerOptions::micro_batches) and
// GradReduction::kOncePerStep (kAuto: when the memory allows) the rank instead accumulates its
// micro-batches in a whole local buffer (4 bytes per value, as one process) and reduces it once, in the
// step's last micro-batch: (micro_batches − 1) fewer reductions for that memory.
// The clip uses the all-reduced norm and AdamW updates the shard's f32 masters. In f32 the masters
// are then all-gathered whole (Comm::all_gather_region: one MPI_Allgatherv). In mixed precision the forward reads bf16 copies of the matrices: each
// matrix is all-gathered in bf16 (half the bytes) straight into its copy, and its f32 masters outside the
// rank's shard are given back to the system (release_pages), so that each rank holds the f32 masters of
// its shard, plus those the forward reads in f32 (norm weights, biases, the embedding table), whole.
// Checkpoints gather the f32 masters on rank 0, which writes them (the other ranks give each tensor back
// as soon as it has passed), and hold one moment file per rank. A rank training on its own device
// (train/device_training.h) gives back the gradient buffers and hands the shard's moments to the device
// (hand_state_to_device), and steps through step_local_grads with AdamW of the shard run there.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/context.h"
#include "core/thread_pool.h"
#include "dist/comm.h"
#include "model/mixed_weights.h"
#include "model/params.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace dc::train {

// Data parallel with several micro-batches per rank: when the gradients are reduce-scattered.
enum class GradReduction {
  kAuto,           // kOncePerStep when micro_batches > 1 and the whole local buffer fits (see OptimizerCore)
  kOncePerStep,    // a whole local gradient buffer, reduced in the step's last micro-batch
  kPerMicroBatch,  // shared slots, every micro-batch reduced (ZeRO-2's least memory)
};

struct OptimizerOptions {
  LrOptions lr;
  AdamWOptions adam;
  double max_grad_norm = 1.0;  // ≤ 0: no clipping
  // Sharded only: the micro-batches each rank runs per step (end_micro_batch calls), and the rule above.
  int64_t micro_batches = 1;
  GradReduction reduction = GradReduction::kAuto;
};

struct OptimizerStepStats {
  int64_t step = 0;              // 1-based optimizer step just done
  double lr = 0, grad_norm = 0;  // the rate used; the gradients' global norm before clipping
  // The update was not applied: the step's loss or the gradients' norm was not finite (a NaN or an
  // infinity, e.g. from an overflow). The weights and moments stay those of the last applied step; the step
  // still counts (the schedule and the data move on). skip_cause says why, e.g. "the gradient norm is nan".
  bool skipped = false;
  std::string skip_cause;
};

// Why a step must not be applied ("" when it may): "the loss is nan", "the gradient norm is inf".
std::string skip_cause(double loss, double grad_norm);
// Starts out_dir/metrics.jsonl (creating out_dir): keeps its lines of steps ≤ `step` (a resumed run continues
// the same curve; lines cut by a kill are dropped), returns them and sets *path.
Result<std::vector<std::string>> open_metrics_file(const std::string& out_dir, int64_t step, std::string* path);

// Consecutive skipped steps after which a trainer stops the run with an error (its weights the last good
// ones): one bad batch is skipped, a diverged run is not trained on for ever.
constexpr int64_t kMaxConsecutiveSkips = 5;
// "<who> step N: update skipped: <cause>; the weights stay those of step M (K in a row)", a skipped step's warning.
std::string skip_note(const std::string& who, const OptimizerStepStats& s, int64_t consecutive);
// The error that stops a run after kMaxConsecutiveSkips skipped steps in a row.
Status too_many_skips(const std::string& who, const OptimizerStepStats& s, int64_t consecutive);

// What a training run holds (this rank's bytes) and the steps it skipped over the whole run, whichever it trains
// (OptimizerCore::footprint, LoraCore::footprint): f32 trainable values (master weights or adapters), Adam
// moments, gradients.
struct TrainFootprint {
  int64_t master_weight_bytes = 0, optimizer_state_bytes = 0, gradient_bytes = 0, skipped_steps = 0;
};

class OptimizerCore {
 public:
  // Step 0 over the master weights `params` (shaped by `config`): zero gradients and moments. Throws
  // std::bad_alloc when memory runs out.
  // With `comm` of more than one rank (kept by pointer; it must outlive the core) the state is sharded
  // over its ranks (every rank passes the same params).
  static OptimizerCore start(const ModelConfig& config, ModelParams params, const OptimizerOptions& options,
                             dist::Comm* comm = nullptr);
  // The state a save() wrote into checkpoint directory `dir` (its f32 weights, moments and
  // trainer_state.json), continued with `options`. The caller compares state().options (the saved run's)
  // with its own, checks the state against its run (check_resumed_state) and reads its extra files from
  // `dir`. Errors name the file and the tensor or field (weights and moments must be finite).
  // Any number of ranks resumes from a checkpoint saved by any other (the moments are re-sharded).
  static Result<OptimizerCore> resume(const std::string& dir, const OptimizerOptions& options,
                                      dist::Comm* comm = nullptr);

  OptimizerCore() = default;  // empty; assign start() or resume()
  OptimizerCore(OptimizerCore&&) = default;
  OptimizerCore& operator=(OptimizerCore&&) = default;

  const ModelConfig& config() const { return config_; }
  const OptimizerOptions& options() const { return options_; }
  // The master weights, changed in place by step(): a Model built once over params().weights() (or over
  // MixedPrecisionWeights refreshed from it) sees every step's values.
  // Sharded in mixed precision (from the first begin_step; on rank 0 except between a save and its next
  // step): only this rank's shard and the tensors the forward reads in f32 hold their values; the rest of
  // the matrices read as zeros, so the bf16 copies must not be re-laid from them (one
  // MixedPrecisionWeights::refresh per step keeps what step() wrote).
  const ModelParams& params() const { return params_; }
  // other ← (1 − alpha)·other + alpha·params() over every value (e.g. GRPO's reference-model sync; other
  // shaped like params()); sharded, each rank mixes its shard and `other` is all-gathered (every rank calls it).
  Status mix_into(ModelParams& other, float alpha);
  // The gradients: the first loss of a step writes them (GradWrite::kOverwrite after begin_step(): no zeroing
  // pass), the others ADD into grads().spans() (Model::backward).
  // Sharded: this rank's local buffer of one step, the layers sharing one slot (reduced by the backward as
  // it goes); the reduced gradients of the shard are kept apart.
  ModelParams& grads() { return grads_; }
  // The moments (unsharded runs only: empty when sharded).
  const ModelParams& m() const { return m_; }
  const ModelParams& v() const { return v_; }
  // Whether the moments are sharded over ranks (more than one rank).
  bool sharded() const { return comm_ != nullptr && comm_->size() > 1; }
  // Bytes of the Adam moments this rank holds (of its shard when sharded; on its device after hand_state_to_device).
  int64_t optimizer_state_bytes() const;
  // Bytes of f32 master weights this rank holds through the steps: 4 per value, or sharded in mixed
  // precision those of its shard and of the tensors the forward reads in f32 (whole pages at the shard's
  // edges not counted; a sharded save gathers them whole for its duration).
  int64_t master_weight_bytes() const;
  // Bytes of gradients this rank holds: the local buffer, and sharded the reduced shard (4 bytes per value).
  int64_t gradient_bytes() const;
  TrainFootprint footprint() const {
    return {master_weight_bytes(), optimizer_state_bytes(), gradient_bytes(), state_.skipped_steps};
  }
  // Sharded: whether the micro-batches are accumulated locally and reduced once per step (GradReduction).
  bool reduces_once_per_step() const { return once_per_step_; }
  // step (optimizer steps done), data cursor, seed and the options fingerprint; saved with checkpoints.
  TrainState& state() { return state_; }
  const TrainState& state() const { return state_; }
  int64_t steps_done() const { return state_.step; }

  // Starts a step (every trainer calls it before the step's first backward). Sharded: clears the shard's
  // sums and binds the reductions during the backward (grads().spans().on_head_done, on_layer_done) to
  // this core; in mixed
  // precision (`mixed` refreshed from params() for this step) the f32 masters outside the shard that only
  // the bf16 copies need are given back, if whole (the first step, after a save). It leaves grads() as
  // they are: the step's first backward must write them (GradWrite::kOverwrite).
  void begin_step(const MixedPrecisionWeights* mixed = nullptr);
  // Sharded: every rank calls it after each micro-batch's loss, the same number of times per step: it
  // reduces the embedding table's gradients. A micro-batch whose loss had no rows (the loss functions
  // then skip the backward) still takes its part in the reductions the other ranks' backwards run, with
  // zeros; a backward stopped midway is an internal error. Unsharded: nothing.
  Status end_micro_batch();
  // One optimizer step: clips the gradients to options().max_grad_norm, AdamW at the rate
  // learning_rate(options().lr, steps_done()), then counts the step. Threads on ctx.pool; the result does
  // not depend on the thread count. Without `mixed` the gradients stay clipped in place. With `mixed`
  // (mixed precision, refreshed from params() this step) the clip is a factor inside the fused AdamW that
  // also writes the next step's bf16 W copies (adamw_step_mixed), and the gradients are left as they
  // were. Sharded: the ZeRO step above (`mixed` written by the all-gather); a failed collective
  // ends the job on every rank with its message (Comm::abort).
  // `loss` is the step's loss (all ranks'); a non-finite loss or gradient norm skips the update (the
  // stats say so; every rank decides alike, from the reduced norm and loss) and counts in
  // consecutive_skips() and state().skipped_steps.
  OptimizerStepStats step(const Context& ctx, MixedPrecisionWeights* mixed = nullptr, double loss = 0.0);
  // Steps skipped in a row up to the last one (0 after an applied step).
  int64_t consecutive_skips() const { return consecutive_skips_; }
  // A trainer whose state lives on a device (train/device_training.h; an unsharded core): the host buffers it
  // downloads the weights and moments into before save(), and the bookkeeping of an optimizer step it ran
  // there (s.lr, grad_norm and skip_cause set): counts the step and its skip as step() does, and returns s
  // with step and skipped filled.
  struct HostState {
    ModelParams& params;
    ModelParams& m;
    ModelParams& v;
  };
  HostState host_state() { return {params_, m_, v_}; }
  OptimizerStepStats count_step(OptimizerStepStats s);
  // This rank's flat range of the values (dist::shard_range; every value when not sharded).
  dist::Range shard() const { return shard_; }
  // Sharded, for a trainer whose gradients and the shard's Adam moments live on a device (train/device_training.h,
  // one device per rank): gives back the host's gradient buffers (grads() is then empty; begin_step and
  // end_micro_batch do nothing) and hands the shard's moments over (zeros, or the resumed ones: [shard().size()]
  // each), so that the core keeps only the f32 masters and the shard's reduced gradients. save() then needs them
  // back first (restore_shard_moments, downloaded from the device), and gives them back again once written.
  struct ShardMoments {
    std::vector<float> m, v;
  };
  ShardMoments hand_state_to_device();
  void restore_shard_moments(ShardMoments moments);
  // Writes the updated values of this rank's shard into params().data()[shard()] (a device's AdamW): given the
  // shard's reduced gradients g [shard().size()], the clip coefficient to scale them by (clip_coefficient of the
  // global norm) and the step's rate.
  using ShardUpdate = std::function<Status(const float* g, float grad_scale, double lr)>;
  // Sharded, after hand_state_to_device: `local` [n_values()] is this rank's whole gradient of the step (its
  // micro-batches accumulated on the device, downloaded once); it is reduce-scattered in one blocking call (rank
  // order, Comm::reduce_scatter_add) into the shard's sums, then step()'s ZeRO step runs with `update` in place of
  // the host's AdamW (not called for a skipped step): the norm of all shards, the update of this rank's shard,
  // the all-gather of params() in f32. A failed collective or update ends the job on every rank (Comm::abort).
  OptimizerStepStats step_local_grads(const Context& ctx, const float* local, double loss, const ShardUpdate& update);

  // Writes out_dir/checkpoint-<steps_done> atomically (save_train_checkpoint: weights, moments, state,
  // source_model_dir's config and small files, and what `extra` writes) and returns its path.
  // Sharded: every rank calls it; the f32 masters are gathered on rank 0 first.
  Result<std::string> save(const std::string& out_dir, const std::string& source_model_dir,
                           const ExtraCheckpointFiles& extra = nullptr);

  // Sharded: every rank calls it (rank 0 writes the shared files).
  // Starts out_dir/metrics.jsonl (creating out_dir; on rank 0 only, other ranks write no metrics): keeps the lines of the steps already done (a resumed
  // run continues the same curve; lines cut by a kill are dropped) and returns them. Later append_metrics
  // calls add to it; without open_metrics they write nothing.
  Result<std::vector<std::string>> open_metrics(const std::string& out_dir);
  // Appends one line, a JSON object with at least a "step" field, to metrics.jsonl.
  Status append_metrics(const std::string& json_object) const;

 private:
  ModelConfig config_;
  OptimizerOptions options_;
  ModelParams params_, grads_, m_, v_;
  dist::Comm* comm_ = nullptr;
  dist::Range shard_;
  std::vector<float> m_shard_, v_shard_;  // sharded: [shard_.size()] each
  std::vector<float> g_shard_;            // sharded: [shard_.size()] the reduced gradients of the shard
  dist::Range layers_;                    // the layers' flat values in the model's layout
  int64_t layer_size_ = 0;                // values per layer (the shared slot of grads_, at layers_.begin)
  int64_t table_size_ = 0;                // the embedding table's values (its slot, at 0, holds the lm_head's too)
  int64_t parts_reduced_ = 0;             // parts of the backward reduced in this micro-batch (head, layers)
  int64_t layer_slots_ = 1;               // layers' storage in grads_ (layer il's at slot il % layer_slots_)
  bool once_per_step_ = false;            // GradReduction::kOncePerStep chosen (grads_ whole)
  int64_t micro_ = 0;                     // micro-batches ended in this step
  // A started reduce-scatter: its handle and the slot it reads, cleared once it is finished (shared slots).
  struct InFlight {
    int64_t handle = 0;
    float* slot = nullptr;
    int64_t size = 0;
  };
  std::vector<InFlight> in_flight_;       // oldest first
  // Whether this micro-batch's backward reduces (always with shared slots; the last one once per step).
  bool reducing() const { return !once_per_step_ || micro_ + 1 == options_.micro_batches; }
  // grads_'s [size] at `slot` as the flat values offset… of the gradients: its reduce-scatter into g_shard_
  // started; the oldest ones finished (and their slots cleared) while more than `keep` remain in flight.
  Status start_reduce(float* slot, int64_t offset, int64_t size, size_t keep);
  Status finish_reduces(size_t keep);
  Status reduce_head();                   // the final norm's, and an untied lm_head's (from the table's slot)
  Status reduce_layer(int64_t il);        // layer il's slot
  // start(): whether to reduce once per step, the whole buffer costing extra_bytes more than the slots.
  bool choose_once_per_step(int64_t extra_bytes) const;
  // The ZeRO step over the reduced g_shard_ (s.lr set): the global norm, AdamW of the shard (the host's, or
  // `update` when given), the all-gather (into `mixed` when given); aborts the job on a failed collective.
  void sharded_update(const Context& ctx, MixedPrecisionWeights* mixed, double loss, OptimizerStepStats& s,
                      const ShardUpdate& update = nullptr);
  bool state_on_device_ = false;          // hand_state_to_device: no gradient buffers, the moments on the device
  bool masters_whole_ = true;
  int64_t resident_values_ = 0;           // the f32 master values the steps keep (master_weight_bytes)
  // The sharded mixed-precision all-gather after AdamW (see the top).
  Status gather_mixed(const Context& ctx, MixedPrecisionWeights& mixed);
  // Gives back the f32 masters outside the shard of the matrices only mixed's copies are read of
  // (released_), counting what is kept.
  void release_masters(const MixedPrecisionWeights& mixed);
  void release_outside_shard(const ModelParams::Tensor& t);
  // Every rank calls it: the released tensors all-gathered in f32, tensor by tensor; the ranks but 0 give
  // each back again at once.
  Status gather_masters_on_rank0();
  std::vector<bool> released_;            // per tensor: given back outside the shard (empty: none)
  static bool forward_reads_f32(const ModelParams::Tensor& t, const MixedPrecisionWeights& mixed);
  TrainState state_;
  int64_t consecutive_skips_ = 0;
  std::string metrics_path_;  // "" until open_metrics
};

}  // namespace dc::train
