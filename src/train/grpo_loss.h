// The Coupled-GRPO loss of DiffuCoder (spec §4.4-4.6): leave-one-out advantages, the coupled
// (complementary) masks, the per-token log-probabilities of a completion from one forward over its three
// noised versions, and the clipped policy-gradient loss with a k3 KL penalty. Its gradient comes from
// the ordinary backward: the loss is a weighted sum of the log-probabilities of the scored rows, so
// d loss / d logits is a weighted cross-entropy gradient (ops/loss.h) with per-row weights
// −(d loss / d logp)·factor, which may be negative.
#pragma once

#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "lora/trainable.h"
#include "model/activations.h"
#include "model/params.h"
#include "model/transformer.h"  // Model, ForwardBatch
#include "train/device_lora_training.h"
#include "train/device_training.h"

namespace dc::train {

// The largest reward magnitude taken (the recipe's rewards are in [0, 2.5]): beyond it the advantages'
// f32 loss gradients overflow, and at ±1e308 the advantages themselves.
constexpr double kMaxAbsReward = 1e30;
// The mask ratio t of a coupled mask is kept kMinMaskRatio from 0 and 1 (the reference draws it in
// [0.2, 0.8]): its weights 1/t and 1/(1 − t) stay finite in f32.
constexpr double kMinMaskRatio = 1e-6;

// Leave-one-out advantages within each group of `group_size` consecutive completions (spec §4.4):
//   A_i = r_i − (Σ_group r_j − r_i) / (G − 1)
// and, with scale_rewards, A_i / (std_group + 1e-4) (unbiased std of the group's rewards). NaN rewards
// count as 0 (the reference's nansum). invalid_argument when group_size < 2 or does not divide the count,
// or naming rewards[i] when it is infinite or beyond ±kMaxAbsReward.
Result<std::vector<double>> leave_one_out_advantages(const std::vector<double>& rewards, int64_t group_size,
                                                     bool scale_rewards);

// One call's coupled masks (spec §4.5): a mask ratio t shared by every row; `partial` [B, C] marks the
// completion positions masked in version 1 (R < t); version 2 masks the others; version 0 masks all.
struct CoupledMask {
  double t = 0.5;
  std::vector<uint8_t> partial;
};

// t = 0.2 + 0.6·u and R_bj uniform in [0, 1), all from hash_counters(seed, ...) (train/rng.h): the
// same seed gives the same masks (the reference draws them with Python's and torch's generators, which
// this engine does not reproduce; the distribution is the same).
CoupledMask draw_coupled_mask(int64_t n_batch, int64_t n_completion, uint64_t seed);

// B completions after their prompts: every prompt has P ≥ 1 tokens (left-padded by the caller) and
// every completion C ≥ 1 tokens.
struct GrpoBatch {
  int64_t n_batch = 0, n_prompt = 0, n_completion = 0;
  std::vector<int32_t> prompt_ids;       // [B, P]
  std::vector<int32_t> completion_ids;   // [B, C]
  std::vector<uint8_t> completion_mask;  // [B, C] (rollout.h completion_mask of each row)
  // [B, P] 1 = a prompt token, 0 = a left pad (RolloutBatch::prompt_mask: prompts of several lengths in one
  // batch); empty = every prompt token real. Each row: its pads, then at least one token.
  std::vector<uint8_t> prompt_mask;
};

// The three versions of every sequence as one forward batch [3B, P + C] and the rows of its logits that
// score a completion position. The forward sees what the rollout's saw: with left pads in the batch
// (GrpoBatch::prompt_mask has a 0), its padding mask (no position attends a pad, a pad's output is 0) and
// positions (cumsum(valid) − 1 from the first prompt token, pads at 1: spec §3.3, the decoder's own), so
// a completion's log-probs do not depend on its batch mates' prompt lengths. Without pads: no mask and
// default positions, the reference's form (spec §4.5 step 5), bit for bit the same forward. (The reference
// scores with no mask even when its batch holds pads, which the recipe's one prompt per device avoids,
// §4.2; that form is not kept: it attends pads the rollout never saw.) With the
// logits shift (spec §2.6) position j of completion b is predicted by row (v·B + b)·(P + C) + P + j − 1.
// Each position is scored twice: by version 0 with factor 1/2, and by version 1 (if partial) with
// factor 1/(2t) or else by version 2 with factor 1/(2(1 − t)); so
//   logp[b, j] = Σ_rows of (b, j) factor · log softmax(logits[row])[target].
// Only the positions with completion_mask 1 get rows unless all_positions.
struct CoupledRows {
  int64_t n_batch = 0, n_seq = 0;  // 3B, P + C
  std::vector<int32_t> tokens;     // [3B, P + C]
  std::vector<uint8_t> valid;      // [3B, P + C] 1 = real, 0 = left pad; empty without pads
  std::vector<int32_t> positions;  // [3B, P + C] RoPE positions; empty without pads (0..P+C−1)
  std::vector<int64_t> out_rows;   // [n_out]
  std::vector<int32_t> targets;    // [n_out] the completion token
  std::vector<int64_t> position;   // [n_out] b·C + j
  std::vector<float> factor;       // [n_out]
  ForwardBatch forward_batch() const;  // views into this object
};

// Checks the batch (sizes, ids in [0, n_vocab), the prompt mask's size and left-pad form, the mask's size
// and t in [kMinMaskRatio, 1 − kMinMaskRatio]) and lays out the rows;
// invalid_argument naming the field otherwise.
Result<CoupledRows> coupled_rows(const GrpoBatch& batch, const CoupledMask& mask, int32_t mask_token_id,
                                 int64_t n_vocab, bool all_positions);

// The coupled log-probabilities [B, C] of `rows` under `model` without gradients (the old log-probs of a
// rollout, the reference model's); positions without rows are 0.
// On a device (a model uploaded with Model::to_device) the lm_head and the cross-entropy run there, chunk by chunk
// of rows (DeviceLossRows: one chunk's logits there at a time), and only each row's CE comes back; `device_rows`
// (may be null: this call's own) holds the rows' device memory.
Result<std::vector<float>> coupled_logps(const Context& ctx, const Model& model, const CoupledRows& rows,
                                         int64_t n_completion, DeviceLossRows* device_rows = nullptr);

struct GrpoLossOptions {
  double beta = 0.01;     // KL coefficient
  double epsilon = 0.5;   // the ratio is clipped to [1 − epsilon, 1 + epsilon]
};

// Per completion b: advantages[b]; per position [B, C]: old_logps (empty: the current log-probs, ratio
// 1) and ref_logps (empty: the current log-probs, KL 0).
struct GrpoLossInputs {
  const GrpoBatch* batch = nullptr;
  const CoupledRows* rows = nullptr;
  std::vector<double> advantages;
  std::vector<float> old_logps, ref_logps;
};

struct GrpoLossResult {
  double loss = 0;
  double kl = 0;             // Σ KL·mask / Σ mask
  double clip_fraction = 0;  // completion tokens whose clipped term wins (no gradient) / Σ mask
  int64_t n_tokens = 0;      // Σ completion_mask
  std::vector<float> logps;  // [B, C] current coupled log-probs (0 where not scored)
};

// The Coupled-GRPO loss (spec §4.6) and its gradient:
//   ratio = exp(logp − old);  L_tok = −min(ratio·A, clip(ratio, 1−ε, 1+ε)·A) + β·(exp(ref−logp) − (ref−logp) − 1)
//   loss = Σ L_tok·mask / max(Σ mask, 1)
// Forward (training mode) over rows, then Model::backward ADDS grad_scale · d loss / d w into grads (with
// kOverwrite, writes them: the first micro-batch of an optimizer step; no rows then zero them).
// d L_tok / d logp = −A·ratio where ratio·A ≤ clip(ratio)·A (else 0) + β·(1 − exp(ref − logp)).
// The advantages, old_logps and ref_logps must be finite (invalid_argument naming the first that is not);
// a loss that still comes out non-finite is returned as it is (the trainer skips such a step).
Result<GrpoLossResult> grpo_loss_and_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                           const GrpoLossOptions& options, float grad_scale, ModelParams& grads,
                                           Activations& acts, const ModelWeights* transposed = nullptr,
                                           GradWrite write = GradWrite::kAdd);
// grpo_loss_and_grads on ctx's device (train/device_training.h): the training forward, the scored rows' lm_head
// and cross-entropy there, chunk by chunk of rows (DeviceLossRows); their CE comes to the host, which computes
// the loss and each row's gradient weight (n_out floats each way); a second pass over the chunks runs the lm_head
// again (the logits are not kept: one chunk's on the device at a time), writes the weighted dlogits and runs the
// head's backward, and Model::backward from the rows' gradient adds (kAdd) or writes (kOverwrite) device.grads().
// The same errors.
Result<GrpoLossResult> grpo_loss_and_device_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                                  const GrpoLossOptions& options, float grad_scale,
                                                  DeviceTraining& device, Activations& acts,
                                                  GradWrite write = GradWrite::kAdd);
// The same for LoRA adapters over a frozen `model`: the forward adds `lora` (its dropout key drawn by the
// caller), and their gradients are ADDED into `grads` (Model::backward_lora).
Result<GrpoLossResult> grpo_loss_and_lora_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                                const GrpoLossOptions& options, float grad_scale, const LoraWeights& lora,
                                                LoraParams& grads, Activations& acts,
                                                const ModelWeights* transposed = nullptr);
// The LoRA variant on a device (grpo --lora-r --device): the forward adds `lora` (uploaded by `device`, no
// dropout), and the adapters' gradients are ADDED into device.grads() (zeroed by the caller at the step's start).
Result<GrpoLossResult> grpo_loss_and_device_lora_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                                       const GrpoLossOptions& options, float grad_scale, const LoraWeights& lora,
                                                       DeviceLoraTraining& device, Activations& acts);

}  // namespace dc::train
