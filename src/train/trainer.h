// Trainer: masked-diffusion fine-tuning of a Dream / DiffuCoder checkpoint on CPU in f32 (f32 master
// weights widened once from the stored dtype): data → noised batches → forward (training mode) →
// fused cross-entropy → backward → clipping → AdamW, with gradient accumulation, checkpoints and resume.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "model/params.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/masked_diffusion.h"
#include "train/optimizer.h"

namespace dc::train {

// Loss and gradients of one noised batch: forward in training mode on batch.tokens (with batch.valid
// and batch.positions when set), the weighted cross-entropy of ops/loss.h on batch.out_rows, and
// Model::backward with dlogits scaled by `grad_scale`, ADDED into grads. Returns the loss (unscaled).
Result<double> loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                              ModelParams& grads, Activations& acts);

struct TrainOptions {
  std::string model_dir, data_path, out_dir;
  int64_t seq_len = 256, batch_size = 4, grad_accum = 1, steps = 100;
  LrOptions lr;
  AdamWOptions adam;
  double max_grad_norm = 1.0;  // ≤ 0: no clipping
  uint64_t seed = 42;
  MaskingOptions masking;      // mask_token_id filled from the config
  int32_t pad_token_id = -1;   // -1: <|dlm_pad|> from the tokenizer, else config.pad_token_id
  bool instruct_template = false;
  bool recompute = false;      // gradient checkpointing: keep only each layer's input, recompute in backward
  int64_t save_every = 0;      // 0: only at the end
  bool resume = false;
  bool force = false;          // allow a non-empty out_dir without --resume
};

struct StepStats {
  int64_t step = 0;           // 1-based optimizer step just done
  double loss = 0, lr = 0, grad_norm = 0;
  int64_t tokens = 0;         // positions through the model in this step (batch · grad_accum · L)
  double seconds = 0;
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

  // One optimizer step (grad_accum micro-batches). Appends a line to out_dir/metrics.jsonl.
  Result<StepStats> step();
  // Writes out_dir/checkpoint-<step> and the loss plot out_dir/loss.svg.
  Status save();

  int64_t steps_done() const { return state_.step; }
  const Dataset& dataset() const { return data_; }
  const ModelParams& params() const { return params_; }
  const std::vector<StepStats>& history() const { return history_; }
  // After a --resume that raised --steps: a line saying so (the LR schedule is stretched); else "".
  const std::string& resume_note() const { return resume_note_; }

 private:
  Trainer() = default;
  Status write_metrics_line(const StepStats& s);

  TrainOptions opt_;
  Context ctx_;
  ModelConfig config_;
  ModelParams params_, grads_, m_, v_;
  Dataset data_;
  std::unique_ptr<DataOrder> order_;
  Activations acts_;
  TrainState state_;
  std::string resume_note_;
  std::vector<StepStats> history_;
};

// An SVG line plot of the loss (and its 10-step moving average) against the step.
std::string loss_plot_svg(const std::vector<StepStats>& history);

}  // namespace dc::train
