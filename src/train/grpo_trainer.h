// GrpoTrainer: the Coupled-GRPO training loop of DiffuCoder (spec §4.2, §4.6, §4.7) on CPU with f32
// master weights: rounds of rollouts (G completions per prompt, scored by rewards) → leave-one-out
// advantages → num_iterations optimizer steps over the round, each over grad_accum micro-batches with
// the coupled loss of grpo_loss.h → clipping → AdamW, a frozen reference model synced every N steps,
// metrics, a reward curve, atomic checkpoints with the reference model and optimizer state, resume.
// The rollouts themselves (the decoder and the rewards) come in through a RolloutFn.
// Data parallel over a dist::Comm of N ranks (`mpirun -np N diffucoder grpo`): each rank generates and
// scores whole groups (prompts_per_round / N prompts of every round), the rewards are gathered so that
// every rank computes the round's advantages and reward statistics over all groups (as the reference's
// gather) and keeps its own rows; each rank runs grad_accum / N micro-batches of the round, the gradients
// are reduced in rank order and the optimizer state sharded as SFT's (OptimizerCore); the reference model
// is mixed from the all-gathered weights, identical on every rank.
// With a device Context (one process, f32: train/device_training.h; a LoRA run's state train/device_lora_training.h,
// the base frozen there as stored and the reference adapters beside the policy's) the rollouts, the old and
// reference log-probs, the coupled loss's forward and backward, the clipping and AdamW run on the device; the
// rewards, the advantages and the loss's per-token arithmetic stay on the host (n_out floats each way per
// micro-batch), and the reference model's sync is mixed on the host and uploaded again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "dist/comm.h"
#include "model/mixed_weights.h"
#include "model/params.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/device_training.h"
#include "train/grpo_loss.h"
#include "train/lora_core.h"
#include "train/optimizer.h"
#include "train/optimizer_core.h"

namespace dc::train {

// One generation round: for each prompt (dataset index) G completions, groups consecutive.
struct Rollout {
  // N = prompts · G rows: prompts left-padded to one length (prompt_mask marks the pads), completion_mask set
  GrpoBatch batch;
  std::vector<double> rewards;  // [N] total reward (NaN counts as 0)
  // Means over the round worth logging, e.g. {"pass_rate", 0.4}, {"format_rate", 0.9}.
  std::vector<std::pair<std::string, double>> metrics;
  // Set when the rewards are still being scored (e.g. on a worker thread: RewardScorer): the trainer calls it
  // once, after the round's old and reference log-probs (which need only the completions), and it waits for
  // the scores and fills `rewards` and `metrics`. Destroying it uncalled (an error before) must wait for the
  // scoring too, so that nothing outlives the round.
  std::function<Status(Rollout&)> await_rewards;
};
// Generates and scores (or starts scoring: Rollout::await_rewards) round `round`'s completions of `prompts`
// with `policy`. Must be a function of
// (its inputs, the seed it was made with): a resumed run calls it again for the round it restarts.
// Data parallel: each rank calls its own with its share of the prompts; every rank's must return the same
// metric names in the same order.
using RolloutFn =
    std::function<Result<Rollout>(const Context& ctx, const Model& policy, int64_t round, const std::vector<int64_t>& prompts)>;

struct GrpoOptions {
  std::string model_dir;         // the policy to start from (and the reference model's initial weights)
  std::string out_dir;           // checkpoints, metrics.jsonl, reward.svg; "" = write nothing
  int64_t n_prompts = 0;         // dataset size (prompts are drawn by index in a seeded order)
  int64_t steps = 2;             // optimizer steps; a multiple of num_iterations (whole rounds)
  int64_t group_size = 10;       // G, completions per prompt (spec §4.7 num_generations)
  int64_t prompts_per_round = 1; // prompts per generation round (the recipe's per-device share: 10 samples = 1 prompt)
  int64_t grad_accum = 2;        // micro-batches per optimizer step (the round's samples split evenly)
  int64_t num_iterations = 2;    // optimizer steps per round, each with its own mask seed
  bool random_masking = true;    // mask seeds drawn per round (else 42 for every iteration)
  bool scale_rewards = false;
  GrpoLossOptions loss;          // beta 0.01, epsilon 0.5
  int64_t ref_sync_steps = 64;   // 0: never sync the reference model
  double ref_mixup_alpha = 0.6;  // ref ← (1 − alpha)·ref + alpha·policy
  LrOptions lr{LrSchedule::kCosine, 1e-6, 0, 1, 0.1};  // total_steps and warmup_steps filled by create
  double warmup_ratio = 1e-4;    // warmup steps = ceil(ratio · steps) (Hugging Face's rule)
  AdamWOptions adam{0.9, 0.99, 1e-8, 0.1, false};
  double max_grad_norm = 0.2;
  uint64_t seed = 42;
  bool recompute = false;        // gradient checkpointing
  // The rollouts' canvas at most, and whether they keep a KV cache (--fast): a device run's memory plan.
  int64_t max_prompt_length = 200, max_completion_length = 256;
  bool rollout_kv_cache = false;
  MatmulPrecision precision = MatmulPrecision::kBF16;  // as TrainOptions::precision
  // r > 0: train LoRA adapters over the frozen base as stored (as TrainOptions::lora): the policy is the base
  // plus the adapters, the reference model the base plus a reference copy of the adapters (so at the start
  // the base itself; no second copy of the weights), which the sync mixes.
  LoraSpec lora;
  int64_t save_every = 0;        // rounds between checkpoints (0: only at the end)
  bool resume = false, force = false;
  // Data parallel over comm's ranks (null or one rank: this process alone; kept by pointer, it must
  // outlive the trainer): prompts_per_round and grad_accum must be multiples of the rank count. Not part
  // of the resume check: a run resumes on any number of ranks.
  dist::Comm* comm = nullptr;
};

struct GrpoStepStats {
  int64_t step = 0, round = 0, iteration = 0;  // 1-based optimizer step; its round and iteration (0-based)
  double loss = 0, kl = 0, clip_fraction = 0, grad_norm = 0, lr = 0;
  double reward_mean = 0, reward_std = 0;      // of the round
  std::vector<std::pair<std::string, double>> metrics;  // the round's rollout metrics (data parallel: the ranks' mean)
  int64_t rollout_tokens = 0;                  // completion tokens generated for this step's round, all ranks (0 on later iterations)
  double rollout_seconds = 0, score_seconds = 0, train_seconds = 0, seconds = 0;
  // The update was not applied (OptimizerStepStats::skipped; a non-finite loss or gradient norm): the
  // weights are the last applied step's. skip_note: the warning to show, naming the step and the cause.
  bool skipped = false;
  std::string skip_note;
};

class GrpoTrainer {
 public:
  // Loads the policy (widened to f32) and the reference model (the same weights); with resume, continues
  // from the newest checkpoint in out_dir (policy, reference model, moments, step, prompt position),
  // refusing different options.
  static Result<std::unique_ptr<GrpoTrainer>> create(const GrpoOptions& options, const Context& ctx, RolloutFn rollout);

  // One optimizer step; the first of a round runs the rollout and the no-gradient passes (old and
  // reference log-probs). Appends to metrics.jsonl; saves at the end of a round when due.
  Result<GrpoStepStats> step();
  // Writes out_dir/checkpoint-<step> (only at a round boundary) and reward.svg. Data parallel: every rank
  // calls step() and save(); rank 0 writes the metrics, the plot and the shared checkpoint files.
  Status save();
  // On a device: downloads the policy's weights and moments into params() / optimizer() (save() and the
  // reference model's sync do it first; between them they are those of the last download). On the CPU: nothing.
  Status sync_to_host();

  int64_t steps_done() const { return lora() ? lora_core_.steps_done() : core_.steps_done(); }
  // A full run's policy and reference weights (empty in a LoRA run); on a device the policy's as of the last
  // sync_to_host().
  const ModelParams& params() const { return core_.params(); }
  const ModelParams& ref_params() const { return ref_; }
  // A LoRA run's adapters and optimizer, and the reference copy of the adapters (else null).
  const LoraCore* lora_core() const { return lora() ? &lora_core_ : nullptr; }
  const LoraParams* ref_adapters() const { return lora() ? &ref_lora_ : nullptr; }
  const std::vector<GrpoStepStats>& history() const { return history_; }
  const OptimizerCore& optimizer() const { return core_; }
  MatmulPrecision precision() const { return ctx_.matmul_precision; }
  TrainFootprint footprint() const { return lora() ? lora_core_.footprint() : core_.footprint(); }

 private:
  GrpoTrainer() = default;
  Status start_round();  // rollout, rows, old and reference log-probs, then rewards and advantages of round state_.step / I
  // The round's rewards gathered over the ranks, their statistics and the rollout metrics into round_stats_,
  // the leave-one-out advantages into round_'s micro-batches.
  Status round_advantages(const Rollout& r, int64_t round);
  bool lora() const { return opt_.lora.r > 0; }
  TrainState& state() { return lora() ? lora_core_.state() : core_.state(); }
  int rank() const { return opt_.comm == nullptr ? 0 : opt_.comm->rank(); }
  int ranks() const { return opt_.comm == nullptr ? 1 : opt_.comm->size(); }
  // The largest micro-batch and rollout of a round, for the device's memory plan (DeviceTraining::start).
  DeviceBatchShape device_batch_shape() const;
  // values [k] of every rank, in rank order ([ranks · k]); one process: values.
  Result<std::vector<double>> gather(const std::vector<double>& values);
  Status write_metrics_line(const GrpoStepStats& s);
  std::unique_ptr<Model> policy_model();  // over the current weights (bf16 copies refreshed when mixed; LoRA: base + adapters)
  // The LoRA setup: the base as stored, the adapters started or resumed from `latest`, the reference copy.
  Status create_lora(const OptimizerOptions& optimizer, const std::string& latest, const std::string& fingerprint);

  struct Micro {
    GrpoBatch batch;
    std::vector<double> advantages;
    std::vector<CoupledRows> rows;                        // [num_iterations]
    std::vector<std::vector<float>> old_logps, ref_logps;  // [num_iterations], empty when not needed
  };

  GrpoOptions opt_;
  ModelConfig config_;
  Context ctx_;
  Workspace workspace_;
  OptimizerCore core_;  // the policy's f32 weights, gradients, Adam moments, step, prompt cursor
  ModelParams ref_;     // the reference model (f32), saved as ref_model.safetensors in checkpoints
  // On a device (ctx_.device != kCpu, from the first step): the policy's state and steps there; the reference
  // model's weights are uploaded too once a round's KL needs them (ref_on_device_).
  std::unique_ptr<DeviceTraining> device_;
  std::unique_ptr<DeviceLoraTraining> device_lora_;  // a LoRA run's instead (the base, adapters and their state)
  bool ref_on_device_ = false;
  MixedPrecisionWeights mixed_;
  // LoRA: the frozen base, its packed weights' wᵀ views, the adapters' state, their reference copy, and the
  // adapters as the policy's forward reads them (this micro-batch's dropout key).
  std::unique_ptr<Model> base_;
  ModelWeights base_transposed_;
  LoraCore lora_core_;
  LoraParams ref_lora_;
  LoraWeights policy_adapters_;
  RolloutFn rollout_;
  std::unique_ptr<DataOrder> order_;
  Activations acts_;
  std::vector<Micro> round_;  // the current round's micro-batches (this rank's)
  GrpoStepStats round_stats_; // the round's reward and rollout numbers
  std::vector<GrpoStepStats> history_;
};

}  // namespace dc::train
