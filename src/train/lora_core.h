// LoraCore: the training state of LoRA adapters over a frozen base (train / grpo --lora-r): the f32 adapters,
// their gradients and both Adam moments (four LoraParams, one small contiguous buffer each), global-norm
// clipping, AdamW with the learning-rate schedule, the step, and checkpoints that PEFT loads
// (OUT/checkpoint-<step>/: adapter_config.json + adapter_model.safetensors, with optimizer.safetensors and
// trainer_state.json beside them) with bit-exact resume. OptimizerCore's rules for everything it shares
// (skipped steps, metrics.jsonl, the resume checks). Data parallel: every rank holds the whole state (an
// adapter is a fraction of a percent of the model) and the gradients are summed over the ranks before the
// clip (a reduce-scatter in rank order, then an all-gather: bit-reproducible for a given N), so every rank
// applies the same update.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "dist/comm.h"
#include "lora/trainable.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/optimizer_core.h"

namespace dc::train {

// A LoRA run's frozen base made ready for its steps (`model` then read by them): at --precision bf16 its
// matrices re-laid once in the bf16 GEMMs' panels (Model::pack_weights, as the engine does); returns the
// backward's wᵀ views of those panels (transposed_panels), an empty view where a matrix has none (f32 or
// quantized: its wᵀ is made per call). Packing that fails for memory leaves the model as stored.
ModelWeights pack_frozen_base(const Context& ctx, Model& model);

// " lora_r=16 lora_alpha=32 lora_targets=q_proj,... lora_dropout=0 rslora=0": a LoRA run's part of the options
// fingerprint a resume compares ("" without adapters).
std::string lora_fingerprint(const LoraSpec& spec);
// A checkpoint to resume (`latest`, "" for none) must be of the run's kind: a LoRA run's (adapter_config.json) when
// `lora`, a full fine-tune's otherwise; invalid_argument naming it and the flag otherwise.
Status check_checkpoint_kind(const std::string& latest, bool lora);

class LoraCore {
 public:
  // Step 0: adapters of `spec` over a model of `config`, PEFT-initialised from `seed` (A Kaiming-uniform,
  // B zero), zero moments. Throws std::bad_alloc when memory runs out. `comm` (may be null) must outlive it.
  static LoraCore start(const ModelConfig& config, const LoraSpec& spec, uint64_t seed, const OptimizerOptions& options,
                        dist::Comm* comm = nullptr);
  // The state a save() wrote into `dir` (the adapter, the moments, trainer_state.json); the caller checks
  // state() against its run. Errors name the file and the tensor or field.
  static Result<LoraCore> resume(const std::string& dir, const ModelConfig& config, const OptimizerOptions& options,
                                 dist::Comm* comm = nullptr);

  LoraCore() = default;
  LoraCore(LoraCore&&) = default;
  LoraCore& operator=(LoraCore&&) = default;

  // The adapters, updated in place by step() (a forward holding params().weights() sees every step's).
  const LoraParams& params() const { return params_; }
  // The gradients: zeroed by begin_step(), added into by the backwards (Model::backward_lora).
  LoraParams& grads() { return grads_; }
  const LoraParams& m() const { return m_; }
  const LoraParams& v() const { return v_; }
  TrainState& state() { return state_; }
  const TrainState& state() const { return state_; }
  int64_t steps_done() const { return state_.step; }
  const OptimizerOptions& options() const { return options_; }
  int64_t consecutive_skips() const { return consecutive_skips_; }
  // The adapters, their moments and gradients: 4, 8 and 4 bytes per trainable value.
  TrainFootprint footprint() const {
    const int64_t n = params_.n_values();
    return {4 * n, 8 * n, 4 * n, state_.skipped_steps};
  }

  void begin_step() { grads_.zero(); }
  // Writes AdamW's update of the adapters elsewhere (a device's copy: train/device_lora_training.h) from the summed
  // gradients grads() scaled by grad_scale (the clip coefficient), at rate lr.
  using AdapterUpdate = std::function<Status(float grad_scale, double lr)>;
  // Sums the gradients over the ranks, clips them to options().max_grad_norm, AdamW at the rate of the
  // schedule (the host's, or `update` when given), counts the step; a non-finite loss or norm skips the update
  // (as OptimizerCore::step). A failed collective or update ends the job on every rank (Comm::abort).
  OptimizerStepStats step(const Context& ctx, double loss, const AdapterUpdate& update = nullptr);
  // Whether the gradients are summed over more than one rank.
  bool data_parallel() const { return comm_ != nullptr && comm_->size() > 1; }
  // A LoRA run whose state lives on a device (train/device_lora_training.h): the host buffers it
  // downloads the adapters and moments into before save(), and the bookkeeping of a step it ran there (s.lr,
  // grad_norm and skip_cause set), as OptimizerCore's.
  struct HostState {
    LoraParams& params;
    LoraParams& m;
    LoraParams& v;
  };
  HostState host_state() { return {params_, m_, v_}; }
  OptimizerStepStats count_step(OptimizerStepStats s);

  // Writes out_dir/checkpoint-<steps_done> atomically (rank 0; every rank calls it) and returns its path.
  // base_model is recorded as adapter_config.json's base_model_name_or_path.
  Result<std::string> save(const std::string& out_dir, const std::string& base_model,
                           const ExtraCheckpointFiles& extra = nullptr);
  // metrics.jsonl as OptimizerCore's (rank 0 writes it).
  Result<std::vector<std::string>> open_metrics(const std::string& out_dir);
  Status append_metrics(const std::string& json_object) const;

 private:
  OptimizerOptions options_;
  LoraParams params_, grads_, m_, v_;
  dist::Comm* comm_ = nullptr;
  TrainState state_;
  int64_t consecutive_skips_ = 0;
  std::string metrics_path_;
};

}  // namespace dc::train
