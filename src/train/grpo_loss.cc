// The Coupled-GRPO loss: advantages, coupled masks, the three-version rows, and the clipped loss with
// its gradient through the weighted cross-entropy of ops/loss.h and Model::backward.
#include "train/grpo_loss.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/number_text.h"
#include "ops/loss.h"
#include "train/rng.h"

namespace dc::train {

Result<std::vector<double>> leave_one_out_advantages(const std::vector<double>& rewards, int64_t group_size,
                                                     bool scale_rewards) {
  const int64_t n = static_cast<int64_t>(rewards.size());
  if (group_size < 2)
    return invalid_argument("group_size must be at least 2 (leave-one-out needs another completion), got " +
                            std::to_string(group_size));
  if (n == 0 || n % group_size != 0)
    return invalid_argument(std::to_string(n) + " rewards do not make whole groups of group_size " +
                            std::to_string(group_size));
  for (int64_t i = 0; i < n; ++i)
    if (std::isinf(rewards[i]) || std::fabs(rewards[i]) > kMaxAbsReward)
      return invalid_argument("rewards[" + std::to_string(i) + "] = " + number_text(rewards[i]) +
                              " is beyond the rewards' range [-1e30, 1e30] (the advantages' gradients would "
                              "overflow): check the reward function or program");
  std::vector<double> a(n);
  for (int64_t g = 0; g < n; g += group_size) {
    double sum = 0;
    for (int64_t i = g; i < g + group_size; ++i) sum += std::isnan(rewards[i]) ? 0.0 : rewards[i];
    const double mean = sum / static_cast<double>(group_size);
    double var = 0;
    for (int64_t i = g; i < g + group_size; ++i) {
      const double r = std::isnan(rewards[i]) ? 0.0 : rewards[i];
      a[i] = r - (sum - r) / static_cast<double>(group_size - 1);
      var += (r - mean) * (r - mean);
    }
    if (!scale_rewards) continue;
    const double std_dev = std::sqrt(var / static_cast<double>(group_size - 1));
    for (int64_t i = g; i < g + group_size; ++i) a[i] /= std_dev + 1e-4;
  }
  return a;
}

CoupledMask draw_coupled_mask(int64_t n_batch, int64_t n_completion, uint64_t seed) {
  CoupledMask m;
  m.t = 0.2 + 0.6 * uniform01(hash_counters(seed, 0x74, ~0ull));
  m.partial.resize(n_batch * n_completion);
  for (int64_t b = 0; b < n_batch; ++b)
    for (int64_t j = 0; j < n_completion; ++j)
      m.partial[b * n_completion + j] = uniform01(hash_counters(seed, 0x52, b, j)) < m.t;
  return m;
}

ForwardBatch CoupledRows::forward_batch() const {
  ForwardBatch fb;
  fb.n_batch = n_batch;
  fb.n_seq = n_seq;
  fb.tokens = tokens.data();
  fb.valid = valid.empty() ? nullptr : valid.data();
  fb.positions = positions.empty() ? nullptr : positions.data();
  fb.out_rows = out_rows.data();
  fb.n_out = static_cast<int64_t>(out_rows.size());
  return fb;
}

namespace {

// Whether batch.prompt_mask holds a pad; invalid_argument unless it is empty or [B, P] of rows of 0s (left
// pads) then 1s with at least one 1 (the last prompt position predicts the first completion token).
Result<bool> check_prompt_mask(const GrpoBatch& batch) {
  const int64_t B = batch.n_batch, P = batch.n_prompt;
  if (batch.prompt_mask.empty()) return false;
  if (static_cast<int64_t>(batch.prompt_mask.size()) != B * P)
    return invalid_argument("GRPO batch: prompt_mask must hold B·P = " + std::to_string(B * P) + " entries, got " +
                            std::to_string(batch.prompt_mask.size()));
  bool padded = false;
  for (int64_t b = 0; b < B; ++b) {
    const uint8_t* m = batch.prompt_mask.data() + b * P;
    int64_t pads = 0;
    while (pads < P && m[pads] == 0) ++pads;
    for (int64_t i = pads; i < P; ++i)
      if (m[i] != 1)
        return invalid_argument("GRPO batch: prompt_mask[" + std::to_string(b) + "][" + std::to_string(i) + "] = " +
                                std::to_string(m[i]) + ": a row is its left pads (0) then its prompt tokens (1)");
    if (pads == P)
      return invalid_argument("GRPO batch: prompt_mask[" + std::to_string(b) + "] has no prompt token (all pads)");
    padded |= pads > 0;
  }
  return padded;
}

// The rollout's padding mask and positions over the three versions (sampler/decoder.cc's canvas):
// valid = the prompt's mask, then 1s over the completion; positions = cumsum(valid) − 1, pads at 1.
void lay_out_padding(const GrpoBatch& batch, CoupledRows& r) {
  const int64_t B = batch.n_batch, P = batch.n_prompt, L = r.n_seq;
  r.valid.assign(r.tokens.size(), 1);
  r.positions.assign(r.tokens.size(), 0);
  for (int64_t v = 0; v < 3; ++v)
    for (int64_t b = 0; b < B; ++b) {
      const uint8_t* m = batch.prompt_mask.data() + b * P;
      const int64_t pads = std::find(m, m + P, uint8_t{1}) - m;
      uint8_t* valid = r.valid.data() + (v * B + b) * L;
      int32_t* pos = r.positions.data() + (v * B + b) * L;
      for (int64_t i = 0; i < L; ++i) {
        valid[i] = i >= pads ? 1 : 0;
        pos[i] = static_cast<int32_t>(i >= pads ? i - pads : 1);
      }
    }
}

}  // namespace

Result<CoupledRows> coupled_rows(const GrpoBatch& batch, const CoupledMask& mask, int32_t mask_token_id,
                                 int64_t n_vocab, bool all_positions) {
  const int64_t B = batch.n_batch, P = batch.n_prompt, C = batch.n_completion, L = P + C;
  if (B < 1 || P < 1 || C < 1)
    return invalid_argument("GRPO batch: needs at least one completion, one prompt token and one completion token "
                            "(got " + std::to_string(B) + " completions, prompt length " + std::to_string(P) +
                            ", completion length " + std::to_string(C) + ")");
  if (static_cast<int64_t>(batch.prompt_ids.size()) != B * P || static_cast<int64_t>(batch.completion_ids.size()) != B * C ||
      static_cast<int64_t>(batch.completion_mask.size()) != B * C)
    return invalid_argument("GRPO batch: prompt_ids, completion_ids and completion_mask must hold B·P, B·C and B·C "
                            "entries");
  if (static_cast<int64_t>(mask.partial.size()) != B * C)
    return invalid_argument("GRPO batch: mask needs " + std::to_string(C) + " entries for each of the " +
                            std::to_string(B) + " completions");
  if (!(mask.t >= kMinMaskRatio && mask.t <= 1 - kMinMaskRatio))
    return invalid_argument("GRPO batch: t must be in (0, 1), at least 1e-6 from either end (its weights 1/t and "
                            "1/(1 - t) must stay finite), got " + number_text(mask.t));
  if (mask_token_id < 0 || mask_token_id >= n_vocab) return invalid_argument("mask_token_id is outside the vocabulary");
  auto check_ids = [&](const std::vector<int32_t>& ids, const char* field, int64_t width) -> Status {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= n_vocab)
        return invalid_argument(std::string("GRPO batch: ") + field + "[" + std::to_string(i / width) + "][" +
                                std::to_string(i % width) + "] = " + std::to_string(ids[i]) +
                                " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    return Status();
  };
  DC_RETURN_IF_ERROR(check_ids(batch.prompt_ids, "prompt_ids", P));
  DC_RETURN_IF_ERROR(check_ids(batch.completion_ids, "completion_ids", C));
  DC_ASSIGN_OR_RETURN(const bool padded, check_prompt_mask(batch));

  CoupledRows r;
  r.n_batch = 3 * B, r.n_seq = L;
  r.tokens.resize(3 * B * L);
  for (int64_t v = 0; v < 3; ++v)
    for (int64_t b = 0; b < B; ++b) {
      int32_t* row = r.tokens.data() + (v * B + b) * L;
      std::copy_n(batch.prompt_ids.data() + b * P, P, row);
      for (int64_t j = 0; j < C; ++j) {
        const bool partial = mask.partial[b * C + j] != 0;
        const bool masked = v == 0 || (v == 1 && partial) || (v == 2 && !partial);
        row[P + j] = masked ? mask_token_id : batch.completion_ids[b * C + j];
      }
    }
  if (padded) lay_out_padding(batch, r);
  const float half = 0.5f, w1 = static_cast<float>(0.5 / mask.t), w2 = static_cast<float>(0.5 / (1.0 - mask.t));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < C; ++j) {
      if (!all_positions && !batch.completion_mask[b * C + j]) continue;
      const bool partial = mask.partial[b * C + j] != 0;
      const int64_t v = partial ? 1 : 2;
      for (const auto& [version, factor] : {std::pair<int64_t, float>{0, half}, {v, partial ? w1 : w2}}) {
        r.out_rows.push_back((version * B + b) * L + P + j - 1);
        r.targets.push_back(batch.completion_ids[b * C + j]);
        r.position.push_back(b * C + j);
        r.factor.push_back(factor);
      }
    }
  return r;
}

namespace {

// The lm_head rows coupled_logps computes at once: a bounded block (311 MB at the 152k vocabulary, the
// size of the loss's own logits at one completion per micro-batch, sharing its workspace buffer) however
// large the batch, and rows enough for the GEMM: on the 0.5B shape a 512-row product took what a 256-row
// one did, and the inference head's 64-row chunks made the log-probs' lm_head 2–2.4x slower.
constexpr int64_t kLogpChunkRows = 512;

// A [count] f32 block for logits: ctx.workspace's (kept between calls: a fresh [rows, 152k] vector costs a
// zero fill and page faults per call, ~0.1 s for 512 rows) or, without a workspace, `own`, the caller's.
float* logits_block(const Context& ctx, int64_t count, std::vector<float>& own) {
  if (ctx.workspace != nullptr) return ctx.workspace->floats("grpo.logits", count);
  own.resize(count);
  return own.data();
}

// logp[position] += factor · (−ce) for every row.
std::vector<float> combine(const CoupledRows& rows, const std::vector<float>& ce, int64_t n) {
  std::vector<double> acc(n, 0.0);
  for (size_t r = 0; r < rows.out_rows.size(); ++r) acc[rows.position[r]] -= static_cast<double>(rows.factor[r]) * ce[r];
  return std::vector<float>(acc.begin(), acc.end());
}

}  // namespace

Result<std::vector<float>> coupled_logps(const Context& ctx, const Model& model, const CoupledRows& rows,
                                         int64_t n_completion, DeviceLossRows* device_rows) {
  const int64_t n_out = static_cast<int64_t>(rows.out_rows.size()), V = model.config().n_vocab,
                E = model.config().n_embd, chunk = std::min(n_out, kLogpChunkRows), n = rows.n_batch / 3 * n_completion;
  std::vector<float> ce(n_out);
  if (ctx.device != Device::kCpu) {  // the rows' lm_head and cross-entropy on the device, their CE downloaded
    DeviceLossRows own;
    DeviceLossRows& scratch = device_rows != nullptr ? *device_rows : own;
    DC_RETURN_IF_ERROR(scratch.reserve(ctx, model.config(), n_out));
    DC_RETURN_IF_ERROR(model.forward_hidden(ctx, rows.forward_batch(), scratch.hidden()));
    if (n_out == 0) return combine(rows, ce, n);
    const std::vector<float> ones(n_out, 1.0f);
    DC_RETURN_IF_ERROR(scratch.head_and_cross_entropy(ctx, model, n_out, rows.targets.data(), ones.data(), nullptr,
                                                      ce.data(), nullptr));
    return combine(rows, ce, n);
  }
  std::vector<float> hidden(n_out * E);  // [n_out, E] the lm_head's input rows
  DC_RETURN_IF_ERROR(model.forward_hidden(ctx, rows.forward_batch(), hidden.data()));
  if (n_out == 0) return combine(rows, ce, n);
  std::vector<float> own;
  try {
    float* logits = logits_block(ctx, chunk * V, own);  // [chunk, V]
    const std::vector<float> ones(chunk, 1.0f);
    for (int64_t r = 0; r < n_out; r += chunk) {
      const int64_t k = std::min(chunk, n_out - r);
      model.lm_head(ctx, hidden.data() + r * E, k, logits, k);
      cross_entropy(ctx, logits, rows.targets.data() + r, ones.data(), k, V, nullptr, ce.data() + r);
    }
  } catch (const std::bad_alloc&) {
    return resource_exhausted("GRPO log-probs: out of memory for a block of " + std::to_string(chunk) + " × " +
                              std::to_string(V) + " logits");
  }
  return combine(rows, ce, n);
}

namespace {

// The loss inputs' sizes and finiteness (grpo_loss_and_grads' errors).
Status check_loss_inputs(const GrpoLossInputs& in) {
  const int64_t B = in.batch->n_batch, C = in.batch->n_completion, n = B * C;
  if (static_cast<int64_t>(in.advantages.size()) != B)
    return invalid_argument("GRPO loss: " + std::to_string(in.advantages.size()) + " advantages for " +
                            std::to_string(B) + " completions");
  if ((!in.old_logps.empty() && static_cast<int64_t>(in.old_logps.size()) != n) ||
      (!in.ref_logps.empty() && static_cast<int64_t>(in.ref_logps.size()) != n))
    return invalid_argument("GRPO loss: old_logps and ref_logps need " + std::to_string(C) + " values for each of the " +
                            std::to_string(B) + " completions");
  auto finite = [](const auto& v, const char* name) -> Status {
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        return invalid_argument(std::string("GRPO loss: ") + name + "[" + std::to_string(i) + "] is " +
                                number_text(v[i]) + ", not a finite number");
    return Status();
  };
  DC_RETURN_IF_ERROR(finite(in.advantages, "advantages"));
  DC_RETURN_IF_ERROR(finite(in.old_logps, "old_logps"));
  return finite(in.ref_logps, "ref_logps");
}

// The loss of grpo_loss_and_grads from each scored row's unweighted CE [n_out] (−log p of its target), and
// each row's gradient weight w[r] (d loss / d logits[r] = w[r]·(softmax − onehot), grad_scale included).
GrpoLossResult coupled_loss(const GrpoLossInputs& in, const GrpoLossOptions& o, const std::vector<float>& ce,
                            float grad_scale, std::vector<float>* row_weights) {
  const GrpoBatch& batch = *in.batch;
  const CoupledRows& rows = *in.rows;
  const int64_t B = batch.n_batch, C = batch.n_completion, n = B * C;
  GrpoLossResult res;
  res.logps = combine(rows, ce, n);
  for (uint8_t m : batch.completion_mask) res.n_tokens += m != 0;
  const double denom = static_cast<double>(std::max<int64_t>(res.n_tokens, 1));
  std::vector<double> dlogp(n, 0.0);  // d loss / d logp
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < C; ++j) {
      const int64_t i = b * C + j;
      if (!batch.completion_mask[i]) continue;
      const double a = in.advantages[b], logp = res.logps[i];
      const double ratio = in.old_logps.empty() ? 1.0 : std::exp(logp - in.old_logps[i]);
      const double clipped = std::clamp(ratio, 1.0 - o.epsilon, 1.0 + o.epsilon);
      const bool unclipped_wins = ratio * a <= clipped * a;
      const double delta = in.ref_logps.empty() ? 0.0 : in.ref_logps[i] - logp;
      const double kl = std::exp(delta) - delta - 1.0;
      res.loss += -std::min(ratio * a, clipped * a) + o.beta * kl;
      res.kl += kl;
      res.clip_fraction += unclipped_wins ? 0.0 : 1.0;
      dlogp[i] = ((unclipped_wins ? -a * ratio : 0.0) + o.beta * (1.0 - std::exp(delta))) / denom;
    }
  res.loss /= denom, res.kl /= denom, res.clip_fraction /= denom;
  // d loss / d logits[row] = d loss / d logp · factor · (onehot − softmax) = w · (softmax − onehot).
  row_weights->resize(rows.out_rows.size());
  for (size_t r = 0; r < rows.out_rows.size(); ++r)
    (*row_weights)[r] = static_cast<float>(-dlogp[rows.position[r]] * rows.factor[r] * grad_scale);
  return res;
}

// The loss of grpo_loss_and_grads on the CPU, then backward(dlogits) (none without scored rows: no_rows()
// instead); the forward adds `lora` (null: the model's own).
template <class Backward, class NoRows>
Result<GrpoLossResult> grpo_loss_then(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                      const GrpoLossOptions& o, float grad_scale, const LoraWeights* lora,
                                      Activations& acts, Backward&& backward, NoRows&& no_rows) {
  const CoupledRows& rows = *in.rows;
  const int64_t n_out = static_cast<int64_t>(rows.out_rows.size()), V = model.config().n_vocab;
  DC_RETURN_IF_ERROR(check_loss_inputs(in));
  std::vector<float> own, ce(n_out);
  float* logits = nullptr;  // [n_out, V], becomes dlogits
  try {
    logits = logits_block(ctx, n_out * V, own);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("GRPO loss: out of memory for the " + std::to_string(n_out) + " × " + std::to_string(V) +
                              " logits of the scored rows; use smaller micro-batches (a larger --grad-accum)");
  }
  ForwardBatch fb = rows.forward_batch();
  fb.lora = lora;
  DC_RETURN_IF_ERROR(model.forward(ctx, fb, logits, nullptr, &acts));
  const std::vector<float> ones(n_out, 1.0f);
  cross_entropy(ctx, logits, rows.targets.data(), ones.data(), n_out, V, logits, ce.data());
  std::vector<float> w;
  GrpoLossResult res = coupled_loss(in, o, ce, grad_scale, &w);
  parallel_for(ctx.pool, n_out, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = logits + r * V;
      for (int64_t k = 0; k < V; ++k) row[k] *= w[r];
    }
  }, 16);
  if (n_out > 0) DC_RETURN_IF_ERROR(backward(logits));
  else no_rows();
  return res;
}

}  // namespace

Result<GrpoLossResult> grpo_loss_and_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                           const GrpoLossOptions& o, float grad_scale, ModelParams& grads,
                                           Activations& acts, const ModelWeights* transposed, GradWrite write) {
  return grpo_loss_then(
      ctx, model, in, o, grad_scale, nullptr, acts,
      [&](const float* dlogits) { return model.backward(ctx, acts, dlogits, grads.spans(), transposed, write); },
      [&] {
        if (write == GradWrite::kOverwrite) grads.zero();
      });
}

namespace {

// grpo_loss_and_device_grads' loss on the device (the forward adds `lora`, null: the model's own), then
// backward(from the rows' hidden gradient), recorded in the submission of the head's second pass (`head`'s
// gradient); no_rows() instead without scored rows.
template <class Backward, class NoRows>
Result<GrpoLossResult> device_grpo_loss_then(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                             const GrpoLossOptions& o, float grad_scale, const LoraWeights* lora,
                                             DeviceLossRows& scratch, const DeviceLossRows::HeadGrad& head,
                                             Activations& acts, Backward&& backward, NoRows&& no_rows) {
  DC_CHECK(ctx.device != Device::kCpu, "grpo_loss_and_device_grads: a device context");
  const CoupledRows& rows = *in.rows;
  const int64_t n_out = static_cast<int64_t>(rows.out_rows.size());
  DC_RETURN_IF_ERROR(check_loss_inputs(in));
  DC_RETURN_IF_ERROR(scratch.reserve(ctx, model.config(), n_out));
  ForwardBatch fb = rows.forward_batch();
  fb.lora = lora;
  DC_RETURN_IF_ERROR(model.forward_hidden(ctx, fb, scratch.hidden(), &acts));
  std::vector<float> ce(n_out), w;
  if (n_out == 0) {  // no scored rows: nothing to add
    DC_RETURN_IF_ERROR(no_rows());
    return coupled_loss(in, o, ce, grad_scale, &w);
  }
  // The rows' CE first, then, the lm_head run again chunk by chunk (one chunk's logits on the device at a time),
  // their gradient weighted by the loss's per-row weights and the head's backward.
  const std::vector<float> ones(n_out, 1.0f);
  DC_RETURN_IF_ERROR(scratch.head_and_cross_entropy(ctx, model, n_out, rows.targets.data(), ones.data(), nullptr,
                                                    ce.data(), nullptr));
  GrpoLossResult res = coupled_loss(in, o, ce, grad_scale, &w);
  const auto then = [&] { return backward(BackwardFrom::hidden(scratch.hidden())); };
  DC_RETURN_IF_ERROR(scratch.head_and_cross_entropy(ctx, model, n_out, rows.targets.data(), w.data(), &head, nullptr,
                                                    nullptr, then));
  return res;
}

}  // namespace

Result<GrpoLossResult> grpo_loss_and_device_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                                  const GrpoLossOptions& o, float grad_scale, DeviceTraining& device,
                                                  Activations& acts, GradWrite write) {
  return device_grpo_loss_then(
      ctx, model, in, o, grad_scale, nullptr, device.rows(), {device.grads().spans().output.data(), write}, acts,
      [&](BackwardFrom from) { return model.record_backward(ctx, acts, from, device.grads().spans(), write); },
      [&] { return write == GradWrite::kOverwrite ? device.grads().zero(ctx) : Status(); });  // zeros to write
}

Result<GrpoLossResult> grpo_loss_and_device_lora_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                                       const GrpoLossOptions& o, float grad_scale, const LoraWeights& lora,
                                                       DeviceLoraTraining& device, Activations& acts) {
  return device_grpo_loss_then(
      ctx, model, in, o, grad_scale, &lora, device.rows(), {}, acts,  // the head frozen
      [&](BackwardFrom from) { return model.record_backward_lora(ctx, acts, from, lora, device.grads().grads()); },
      [] { return Status(); });
}

Result<GrpoLossResult> grpo_loss_and_lora_grads(const Context& ctx, const Model& model, const GrpoLossInputs& in,
                                                const GrpoLossOptions& o, float grad_scale, const LoraWeights& lora,
                                                LoraParams& grads, Activations& acts, const ModelWeights* transposed) {
  return grpo_loss_then(
      ctx, model, in, o, grad_scale, &lora, acts,
      [&](const float* dlogits) { return model.backward_lora(ctx, acts, dlogits, lora, grads.grads(), transposed); },
      [] {});
}

}  // namespace dc::train
