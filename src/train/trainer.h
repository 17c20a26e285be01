// Trainer: masked-diffusion fine-tuning of a Dream / DiffuCoder checkpoint in f32 master weights (widened
// once from the stored dtype): data → noised batches → forward (training mode) → fused cross-entropy →
// backward → clipping → AdamW, with gradient accumulation, checkpoints and resume; on the CPU, or with a
// device Context on that device (train/device_sft.h, train/device_training.h, train/device_lora_training.h: one
// process, f32; a full fine-tune or LoRA adapters without dropout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "model/mixed_weights.h"
#include "model/params.h"
#include "lora/trainable.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/device_sft.h"
#include "train/lora_core.h"
#include "train/masked_diffusion.h"
#include "train/optimizer.h"
#include "train/optimizer_core.h"

namespace dc::train {

// Loss and gradients of one noised batch: forward in training mode on batch.tokens (with batch.valid
// and batch.positions when set), the weighted cross-entropy of ops/loss.h on batch.out_rows, and
// Model::backward with dlogits scaled by `grad_scale`, ADDED into grads (e.g. OptimizerCore::grads()), or
// with `write` kOverwrite written into them (the first micro-batch of a step: no zeroing pass; a batch
// without loss rows writes zeros). Returns the loss (unscaled).
// Mixed precision (bf16_backward(ctx)): `transposed` holds the bf16 wᵀ of every matrix
// (MixedPrecisionWeights::transposed()); without it they are made per call. `times` (may be null)
// receives the forward's and the backward's wall time.
struct LossTimes {
  double forward_s = 0, backward_s = 0;
};
Result<double> loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                              ModelParams& grads, Activations& acts, const ModelWeights* transposed = nullptr,
                              LossTimes* times = nullptr, GradWrite write = GradWrite::kAdd);
// The same for LoRA adapters over a frozen `model`: the forward with batch.lora = &lora, the gradients of
// the adapters ADDED into `grads` (Model::backward_lora).
Result<double> loss_and_lora_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                                   const LoraWeights& lora, LoraParams& grads, Activations& acts,
                                   const ModelWeights* transposed = nullptr, LossTimes* times = nullptr);

struct TrainOptions {
  std::string model_dir, data_path;
  std::string out_dir;         // checkpoints, metrics.jsonl, loss.svg; "" = write nothing (benchmarks)
  int64_t seq_len = 256, batch_size = 4, grad_accum = 1, steps = 100;
  LrOptions lr;
  AdamWOptions adam;
  double max_grad_norm = 1.0;  // ≤ 0: no clipping
  uint64_t seed = 42;
  MaskingOptions masking;      // mask_token_id filled from the config
  int32_t pad_token_id = -1;   // -1: <|dlm_pad|> from the tokenizer, else config.pad_token_id
  bool instruct_template = false;
  bool recompute = false;      // gradient checkpointing: keep only each layer's input, recompute in backward
  // kBF16: mixed precision (f32 master weights and Adam state; the forward's and backward's GEMMs on
  // bf16 operands with f32 sums, weights re-laid once per optimizer step); needs AVX512_BF16, else the
  // trainer runs kF32 and says so. kF32: every GEMM in f32 (the gradient-parity tests' path).
  MatmulPrecision precision = MatmulPrecision::kBF16;
  // r > 0: train LoRA adapters of this spec over the frozen base, model_dir's weights as they are stored
  // (bf16 / f16 / f32, q8 / q4 for a QLoRA-style run, a GGUF's blocks): only the adapters' A and B are
  // trained (f32, with their moments); checkpoints hold them in PEFT's layout (LoraCore). No --resume across
  // the two modes.
  LoraSpec lora;
  int64_t save_every = 0;      // 0: only at the end
  bool resume = false;
  bool force = false;          // allow a non-empty out_dir without --resume
  // Data parallel over comm's ranks (null or one rank: this process alone; kept by pointer, it must
  // outlive the trainer): each optimizer step's grad_accum micro-batches (the same global batch as one
  // process) are split into contiguous runs of grad_accum / N, rank r running the r-th; the optimizer
  // state is sharded (OptimizerCore). grad_accum must be a multiple of N. Not part of the resume check:
  // a run resumes on any number of ranks.
  dist::Comm* comm = nullptr;
};

struct StepStats {
  int64_t step = 0;           // 1-based optimizer step just done
  double loss = 0, lr = 0, grad_norm = 0;
  int64_t tokens = 0;         // positions through the model in this step (batch · grad_accum · L, all ranks)
  int64_t loss_rows = 0;      // masked positions scored (rows of the loss) in this step
  double seconds = 0;
  double fwd_bwd_seconds = 0, optimizer_seconds = 0;  // parts of `seconds` (the rest: masking, setup)
  double forward_seconds = 0, backward_seconds = 0;   // the two parts of fwd_bwd_seconds (+ the loss)
  // Mixed precision: MixedPrecisionWeights::refresh at the start of the step (the full re-layout on the
  // first step only; afterwards AdamW writes the copies, in optimizer_seconds, and this takes the vectors).
  double relayout_seconds = 0;
  // The update was not applied (OptimizerStepStats::skipped): the weights are the last applied step's.
  // skip_note: the warning to show, naming the step and the cause.
  bool skipped = false;
  std::string skip_note;
};

class Trainer {
 public:
  // Loads the model (widened to f32), its tokenizer (tokenizer.json in model_dir) and the data; with
  // resume, continues from the newest checkpoint in out_dir (weights, moments, step, data position),
  // refusing different options. Errors name the file or option.
  static Result<std::unique_ptr<Trainer>> create(const TrainOptions& options, const Context& ctx);
  // The same over already tokenised sequences of options.seq_len tokens (options.data_path is then
  // only recorded in the resume check).
  static Result<std::unique_ptr<Trainer>> create_with_data(const TrainOptions& options, const Context& ctx,
                                                           Dataset data);
  // The same over f32 weights already in memory (e.g. a synthetic model of `bench --train`) instead of
  // options.model_dir's; no resume, and save() needs options.model_dir (the files copied beside the weights).
  static Result<std::unique_ptr<Trainer>> create_with_params(const TrainOptions& options, const Context& ctx,
                                                             const ModelConfig& config, ModelParams params,
                                                             Dataset data);

  // One optimizer step (grad_accum micro-batches). Appends a line to out_dir/metrics.jsonl (when out_dir
  // is set). Out of memory: resource_exhausted (the trainer must not step again after an error).
  Result<StepStats> step();
  // A LoRA run (options.lora.r > 0) over a base model already in memory (e.g. a synthetic bf16 / q8 model of
  // `bench --train --lora-r`) instead of options.model_dir's; no resume (save() needs options.model_dir).
  static Result<std::unique_ptr<Trainer>> create_with_model(const TrainOptions& options, const Context& ctx,
                                                            std::unique_ptr<Model> base, Dataset data);

  // Writes out_dir/checkpoint-<step> and the loss plot out_dir/loss.svg. Errors when out_dir is empty.
  // Data parallel: every rank calls it (and step(), whose loss is that of the global batch).
  Status save();
  // On a device: downloads the weights and moments into params() / optimizer(), a LoRA run's adapters and moments
  // into lora() (save() does it first; between steps they are those of the last download). On the CPU: nothing.
  Status sync_to_host();

  // Frees the scratch the steps keep for reuse (the forward's activations and the matmul backward's
  // temporaries, e.g. [n_vocab, n_embd] f32 for the lm_head); the next step allocates it again.
  void release_scratch() { workspace_.release(); }
  int64_t scratch_bytes() const { return workspace_.bytes(); }

  int64_t steps_done() const { return opt_.lora.r > 0 ? lora_core_.steps_done() : core_.steps_done(); }
  MatmulPrecision precision() const { return ctx_.matmul_precision; }  // what the steps run in
  const ModelConfig& config() const { return config_; }
  const Dataset& dataset() const { return data_; }
  // A full fine-tune's weights and optimizer (empty in a LoRA run); on a device, as of the last sync_to_host().
  const ModelParams& params() const { return core_.params(); }
  const OptimizerCore& optimizer() const { return core_; }
  // A LoRA run (options.lora.r > 0): its adapters and optimizer, else null.
  const LoraCore* lora() const { return opt_.lora.r > 0 ? &lora_core_ : nullptr; }
  TrainFootprint footprint() const { return opt_.lora.r > 0 ? lora_core_.footprint() : core_.footprint(); }
  const std::vector<StepStats>& history() const { return history_; }
  // After a --resume that raised --steps: a line saying so (the LR schedule is stretched); else "".
  const std::string& resume_note() const { return resume_note_; }

 private:
  Trainer() = default;
  // The rest of the setup once core_ holds the weights (and, resumed from checkpoint `latest`, the
  // saved state; else latest is ""): the options check, the data, out_dir and its metrics.
  static Result<std::unique_ptr<Trainer>> finish_setup(std::unique_ptr<Trainer> t, Dataset data,
                                                       const std::string& latest);
  Status write_metrics_line(const StepStats& s);
  Result<StepStats> step_or_throw();  // step() without turning std::bad_alloc into a Status

  TrainState& state() { return opt_.lora.r > 0 ? lora_core_.state() : core_.state(); }
  Status open_metrics(std::vector<std::string>* kept);

  TrainOptions opt_;
  ModelConfig config_;
  Context ctx_;          // ctx_.workspace = &workspace_
  Workspace workspace_;
  OptimizerCore core_;   // weights, gradients, moments, step, data cursor
  Dataset data_;
  std::unique_ptr<DataOrder> order_;
  Activations acts_;
  MixedPrecisionWeights mixed_;  // the bf16 copies of this step (precision kBF16)
  std::unique_ptr<Model> model_;  // built at the first step over core_.params() (or mixed_.forward()); LoRA: the base
  LoraCore lora_core_;            // a LoRA run's adapters, gradients and moments
  std::unique_ptr<DeviceTraining> device_;  // on a device (ctx_.device != kCpu): the state and steps there, from the first step
  std::unique_ptr<DeviceLoraTraining> device_lora_;  // the same for a LoRA run on a device
  ModelWeights lora_transposed_;  // LoRA, mixed precision: the packed bf16 base's wᵀ views (empty where none)
  std::string resume_note_;
  std::vector<StepStats> history_;
};

// An SVG line plot of the loss (and its 10-step moving average) against the step.
std::string loss_plot_svg(const std::vector<StepStats>& history);

}  // namespace dc::train
