// DeviceHeadSampler: the HeadSampler (ops/head_sampler.h) of a device (Context::backend): the forward leaves
// the final-normed hidden rows in device memory of this object's own, and every step — greedy or sampled,
// with or without top-k / top-p — computes the lm_head of the rows asked for, the filters, the token and its
// confidence on the device (DeviceBackend::sample_rows), downloading 16 bytes per position (a token and
// three confidences) instead of the [rows, n_vocab] logits. The random draws are the CPU's: each position's
// uniform comes from its own stream (ops/head_sampler.h HeadRow) on the host and is uploaded (4 bytes).
// A step is one submission (issue 35), a server's merged step of several requests too (sample_parts):
// forward() checks the batch and keeps a copy of its host inputs; the body is recorded with the step's lm_head
// and sampling by the sample() (or logits()) that follows, and the device runs all three at once. A forward
// that no step reads runs alone at the next forward() or release().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/context.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "ops/head_sampler.h"

namespace dc {

class DeviceHeadSampler final : public HeadSampler {
 public:
  // Host bytes of a step per position: its hidden row index, its uniform, its token and three confidences.
  static constexpr int64_t kHostBytesPerPosition = 4 + 4 + 4 + 3 * 4;

  // `ctx`: a device context (ctx.backend set, the model's weights uploaded).
  DeviceHeadSampler(const Model& model, const Context& ctx) : model_(model), ctx_(ctx) {}

  // Model::forward_hidden over `batch` into this object's device rows (grown as needed), run by the next
  // sample() or logits() in the same submission as theirs. Checks the batch now (Model::check_forward); the
  // forward's device errors come from that call. `batch`'s host arrays are copied: the caller may reuse them.
  Status forward(const ForwardBatch& batch) { return forward(std::span<const ForwardBatch>(&batch, 1)); }
  // The same over several parts in one forward (Model::forward_hidden_parts: a server's cached requests, each
  // over its own KV cache): the parts' hidden rows one after the other; errors name the part.
  Status forward(std::span<const ForwardBatch> parts);

  int64_t n_rows() const override { return n_rows_; }
  // The lm_head of hidden rows [first, first + n) on the device, downloaded to out[n, n_vocab].
  Status logits(int64_t first, int64_t n, float* out) override;
  // Each entry's token and confidence computed on the device with sampler/filters.h's rules (the same
  // tokens as the CPU's sample_token on logits()'s rows but where a draw or the top-p mass falls within
  // rounding of a boundary; confidences within 2e-5: the device's exp and summation order).
  Status sample(const HeadSampling& args, std::span<TokenSample> out) override { return sample_as_one_part(args, out); }
  // The same over several requests' parts in one submission: the lm_head of every part's rows in one product
  // (a row's logits do not depend on the rows with it), then each part's sampling with its own filters over its
  // rows of the block, and one download of all the tokens and confidences.
  Status sample_parts(std::span<const HeadSampling> parts, std::span<TokenSample> out, std::span<Status> status) override;
  // Frees the device memory of the hidden rows and of the logits block (the next forward grows them again),
  // after running a forward still pending (it may refresh the KV cache).
  void release() override;

  // Bytes of device memory this object holds now (the hidden rows and the logits block).
  int64_t device_bytes() const { return (capacity_rows_ * model_.config().n_embd + logits_capacity_) * 4; }

 private:
  // The lm_head runs on at least this many rows (padded with copies of the last): the device's GEMM takes
  // another kernel, which sums in another order, below it (a matrix-vector kernel for n <= 8 rows), and a
  // row's logits must not depend on how many rows are asked for with it (HeadSampler's contract).
  static constexpr int64_t kMinHeadRows = 9;
  // Grows the logits block to max(n, kMinHeadRows) rows (device memory of this object's, kept for the next
  // steps). Under the device's lock, before begin().
  Status reserve_logits(int64_t n);
  // Records the lm_head of the hidden rows `rows` (indices into this forward's rows) into the logits block
  // (its first rows.size() rows of n_vocab; reserve_logits first) and returns it (nullptr after a device
  // error, in status()). Under the device's lock, between begin() and finish().
  DeviceIn record_logits(std::vector<int32_t> rows);
  // One part of the forward() not yet run: its batch, pointing into this object's copies of the host arrays.
  struct PendingPart {
    ForwardBatch batch;
    std::vector<int32_t> tokens, positions;
    std::vector<uint8_t> valid;
    std::vector<int64_t> out_rows;
  };
  struct PendingForward {
    std::vector<PendingPart> parts;  // not resized once filled: the batches point into them
    std::vector<ForwardBatch> batches() const;
  };
  // Records the pending forward (if any) into the backend's open forward. Under the device's lock, after begin().
  Status record_pending();
  // finish(), then the pending forward is done (run, or on an error dropped).
  Status finish_step();
  // Forgets the pending forward; one that did not run (`ran` false) leaves the caches it refreshes unfilled.
  void drop_pending(bool ran);
  // Runs the pending forward alone (a forward that no sample() or logits() read).
  Status run_pending();

  const Model& model_;
  Context ctx_;
  std::unique_ptr<DeviceMemory> hidden_;  // [capacity_rows_, n_embd] on the device
  std::unique_ptr<DeviceMemory> logits_;  // [logits_capacity_ / n_vocab, n_vocab] on the device
  int64_t capacity_rows_ = 0, n_rows_ = 0, logits_capacity_ = 0;  // logits_capacity_: floats
  std::optional<PendingForward> pending_;  // the last forward() until a step runs it
};

}  // namespace dc
