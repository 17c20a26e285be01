// DeviceHeadSampler: the HeadSampler (ops/head_sampler.h) of a device (Context::backend): the forward leaves
// the final-normed hidden rows in device memory of this object's own, and a greedy step with no top-k /
// top-p (temperature 0: Dream's deterministic decoding) computes the lm_head of the rows asked for, each
// row's argmax and its three confidences on the device, downloading O(rows) numbers instead of the
// [rows, n_vocab] logits. Other steps (sampling, top-k / top-p) download the rows' logits and sample them
// with the CPU's sample_head_rows, as the CPU does.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/context.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "ops/head_sampler.h"

namespace dc {

class DeviceHeadSampler final : public HeadSampler {
 public:
  // `ctx`: a device context (ctx.backend set, the model's weights uploaded); its pool samples on the host.
  DeviceHeadSampler(const Model& model, const Context& ctx) : model_(model), ctx_(ctx) {}

  // Model::forward_hidden over `batch` into this object's device rows (grown as needed).
  Status forward(const ForwardBatch& batch);

  int64_t n_rows() const override { return n_rows_; }
  // The lm_head of hidden rows [first, first + n) on the device, downloaded to out[n, n_vocab].
  Status logits(int64_t first, int64_t n, float* out) override;
  // Greedy and unfiltered (args.filter.temperature 0, top_k <= 0, top_p >= 1): each entry's token (the
  // argmax of its row's logits, lowest id on ties) and confidence computed on the device (within 2e-5 of
  // the CPU's: the device's exp and summation order). Otherwise logits() of the rows args.rows span, then
  // sample_head_rows on the host.
  Status sample(const HeadSampling& args, std::span<TokenSample> out) override;

  // True when sample() keeps this filter's step on the device.
  static bool samples_on_device(const FilterConfig& f) { return f.temperature == 0.0f && f.top_k <= 0 && f.top_p >= 1.0f; }

 private:
  // Records the lm_head of the hidden rows `rows` (indices into this forward's rows) into device buffer
  // "head.logits" [rows.size(), n_vocab] and returns it (nullptr after a device error, in status()).
  float* record_logits(const std::vector<int32_t>& rows);

  const Model& model_;
  Context ctx_;
  std::unique_ptr<DeviceMemory> hidden_;  // [capacity_rows_, n_embd] on the device
  int64_t capacity_rows_ = 0, n_rows_ = 0;
};

}  // namespace dc
