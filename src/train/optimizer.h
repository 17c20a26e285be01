// AdamW (decoupled weight decay, PyTorch torch.optim.AdamW semantics), global-norm gradient clipping
// and learning-rate schedules (Hugging Face transformers' get_scheduler semantics).
#pragma once

#include <cstdint>
#include <string>

#include "core/context.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "dist/comm.h"
#include "model/mixed_weights.h"
#include "model/params.h"

namespace dc::train {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  bool decay_vectors = false;  // false: no decay for norm weights and biases (Hugging Face Trainer's rule)
};

// One AdamW step t (1-based) on n values, exactly as torch.optim.AdamW (single-tensor path) does
// (adamw_value, ops/adamw.h):
//   p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//   p ← p − lr/(1−β1^t) · m / (√v / √(1−β2^t) + eps)
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr, double beta1,
                  double beta2, double eps, double weight_decay);

// adamw_update over every tensor of params (matching tensors of grads / m / v), threaded over tensors
// chunks. Matrices get opt.weight_decay; norm weights and biases only if opt.decay_vectors.
void adamw_step(ModelParams& params, const ModelParams& grads, ModelParams& m, ModelParams& v, int64_t t, double lr,
                const AdamWOptions& opt, ThreadPool* pool);
// Mixed precision's optimizer step, one pass over the f32 state: clip_grad_norm's scaling (grad_scale,
// clip_coefficient) applied as the gradients are read, adamw_step, and every matrix's bf16 W copy
// in `mixed` (MixedPrecisionWeights::panels_of) written from the updated weights, for the next step's
// refresh() to keep. The same params, m and v bit for bit as clip_grad_norm then adamw_step (grads are
// left unscaled). Needs bf16_backward(ctx) and a refreshed `mixed`.
void adamw_step_mixed(const Context& ctx, ModelParams& params, const ModelParams& grads, ModelParams& m, ModelParams& v,
                      int64_t t, double lr, const AdamWOptions& opt, float grad_scale, MixedPrecisionWeights& mixed);

// √(Σ g²) over every gradient: double sums per chunk of 64 Ki values, threaded, combined in a fixed
// order (the result does not depend on the thread count).
double global_grad_norm(const ModelParams& grads, ThreadPool* pool = nullptr);
// Σ x² over x [n] in double, chunk by chunk as global_grad_norm (threaded; the same result for any thread
// count): a rank's part of the global norm when the gradients are sharded.
double sum_of_squares(const float* x, int64_t n, ThreadPool* pool = nullptr);
// ZeRO's optimizer step over one shard (dist::Range, flat indices into params.data()) of the master
// weights: adamw_value with the gradients g, moments m and v of the shard ([shard.size()] each, index 0
// at shard.begin) and grad_scale (the clip coefficient), each value's weight decay that of its tensor.
// The same values bit for bit as adamw_step (and adamw_step_mixed) over the whole model.
void adamw_shard(ModelParams& params, dist::Range shard, const float* g, float* m, float* v, int64_t t, double lr,
                 const AdamWOptions& opt, float grad_scale, ThreadPool* pool);
// torch.nn.utils.clip_grad_norm_: if max_norm > 0, scales every gradient by min(1, max_norm / (norm + 1e-6)).
// Returns the norm before clipping.
double clip_grad_norm(ModelParams& grads, double max_norm, ThreadPool* pool = nullptr);
// That scale as f32: max_norm / (norm + 1e-6) when max_norm > 0 and it is below 1, else 1.
float clip_coefficient(double norm, double max_norm);

enum class LrSchedule { kConstant, kLinear, kCosine };
Result<LrSchedule> parse_lr_schedule(const std::string& name);  // "constant", "linear", "cosine"

struct LrOptions {
  LrSchedule schedule = LrSchedule::kCosine;
  double lr = 1e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;  // the rate decays to lr·min_lr_ratio (cosine_with_min_lr; linear too)
};

// The learning rate of optimizer step `step` (0-based): lr·step/warmup while step < warmup (HF's
// warmup, so step 0 has rate 0), then constant, or decayed over [warmup, total) linearly or by half a
// cosine from lr to lr·min_lr_ratio (HF cosine_with_min_lr with min_lr_rate).
double learning_rate(const LrOptions& o, int64_t step);

// The optimizer's numbers as a trainer takes them (NaN fails every check): lr finite and ≥ 0,
// min_lr_ratio in [0, 1], warmup_steps ≥ 0, beta1 and beta2 in [0, 1) (1 divides by 0 in the bias
// correction), eps finite and > 0, weight_decay finite and ≥ 0, max_grad_norm finite (≤ 0: no clipping).
// invalid_argument naming the option by its flag (--lr) and its field (lr) otherwise.
Status check_optimizer_options(const LrOptions& lr, const AdamWOptions& adam, double max_grad_norm);
// `value` finite and in [lo, hi] (the bounds' ends open where *_open), else invalid_argument
// "<name>: must be ... (got <value>)".
Status check_finite_in(const std::string& name, double value, double lo, double hi, bool lo_open = false,
                       bool hi_open = false);

}  // namespace dc::train
