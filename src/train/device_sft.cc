// The SFT loss on a device (train/device_sft.h).
#include "train/device_sft.h"

#include <chrono>
#include <vector>

#include "train/trainer.h"

namespace dc::train {

namespace {

// The training forward of `batch` (with `lora`, or null), then in one submission the lm_head on its loss rows, the
// weighted cross-entropy there (dlogits scaled by grad_scale) and the head's backward (`head`'s gradient), chunk by
// chunk (DeviceLossRows), and backward(from the hidden rows' gradient), which records the model's backward there;
// none() instead without loss rows.
template <typename Backward, typename None>
Result<double> device_loss(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                           const LoraWeights* lora, Activations& acts, LossTimes* times, DeviceLossRows& rows,
                           const DeviceLossRows::HeadGrad& head, Backward&& backward, None&& none) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n_out = static_cast<int64_t>(batch.out_rows.size());
  ForwardBatch fb;
  fb.n_batch = batch.n_batch, fb.n_seq = batch.n_seq, fb.tokens = batch.tokens.data();
  fb.valid = batch.valid.empty() ? nullptr : batch.valid.data();
  fb.positions = batch.positions.empty() ? nullptr : batch.positions.data();
  fb.out_rows = batch.out_rows.data(), fb.n_out = n_out;
  fb.lora = lora;
  DC_RETURN_IF_ERROR(rows.reserve(ctx, model.config(), n_out));
  DC_RETURN_IF_ERROR(model.forward_hidden(ctx, fb, rows.hidden(), &acts));
  const auto t1 = std::chrono::steady_clock::now();
  if (n_out == 0) {  // no loss rows: nothing to add
    DC_RETURN_IF_ERROR(none());
    return 0.0;
  }
  std::vector<float> weights(batch.weights);  // the gradients' scale in the loss weights: dlogits come out scaled
  for (float& w : weights) w *= grad_scale;
  float loss = 0;
  DC_RETURN_IF_ERROR(rows.head_and_cross_entropy(ctx, model, n_out, batch.targets.data(), weights.data(), &head, nullptr,
                                                 &loss, [&] { return backward(BackwardFrom::hidden(rows.hidden())); }));
  if (times != nullptr) {  // the head's forward runs in the backward's submission: counted there
    times->forward_s = std::chrono::duration<double>(t1 - t0).count();
    times->backward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  }
  return static_cast<double>(loss) / grad_scale;
}

}  // namespace

Result<double> device_loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch, float grad_scale,
                                     Activations& acts, GradWrite write, LossTimes* times, DeviceTraining& device) {
  return device_loss(
      ctx, model, batch, grad_scale, nullptr, acts, times, device.rows(), {device.grads().spans().output.data(), write},
      [&](BackwardFrom from) { return model.record_backward(ctx, acts, from, device.grads().spans(), write); },
      [&] { return write == GradWrite::kOverwrite ? device.grads().zero(ctx) : Status(); });  // zeros to write
}

Result<double> device_lora_loss_and_grads(const Context& ctx, const Model& model, const MaskedBatch& batch,
                                          float grad_scale, const LoraWeights& lora, Activations& acts, LossTimes* times,
                                          DeviceLoraTraining& device) {
  return device_loss(
      ctx, model, batch, grad_scale, &lora, acts, times, device.rows(), {},  // the head frozen
      [&](BackwardFrom from) { return model.record_backward_lora(ctx, acts, from, lora, device.grads().grads()); },
      [] { return Status(); });
}

}  // namespace dc::train
