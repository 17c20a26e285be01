// DeviceHeadSampler: the hidden rows on the device; greedy steps sampled there, the others on the host.
#include "engine/device_head_sampler.h"

#include <cmath>
#include <new>
#include <string>

#include "core/check.h"
#include "ops/elementwise.h"
#include "sampler/filters.h"

namespace dc {

Status DeviceHeadSampler::forward(const ForwardBatch& batch) {
  n_rows_ = 0;
  const int64_t E = model_.config().n_embd;
  if (batch.n_out > capacity_rows_) {
    hidden_.reset();
    const std::unique_lock<std::mutex> lock = ctx_.backend->lock();  // allocate() runs under the device's lock
    DC_ASSIGN_OR_RETURN(hidden_, ctx_.backend->allocate(batch.n_out * E * static_cast<int64_t>(sizeof(float)),
                                                         "the hidden rows of " + std::to_string(batch.n_out) + " positions"));
    capacity_rows_ = batch.n_out;
  }
  DC_RETURN_IF_ERROR(model_.forward_hidden(ctx_, batch, hidden_ != nullptr ? hidden_->data() : nullptr));
  n_rows_ = batch.n_out;
  return Status::ok_status();
}

float* DeviceHeadSampler::record_logits(const std::vector<int32_t>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size()), E = model_.config().n_embd, V = model_.config().n_vocab;
  const int32_t* index = device_copy(ctx_, "head.index", rows.data(), n);
  float* picked = device_floats(ctx_, "head.rows", n * E);  // [n, E]
  float* logits = device_floats(ctx_, "head.logits", n * V);  // [n, V]
  if (!device_status(ctx_).ok()) return nullptr;
  gather_rows(ctx_, hidden_->data(), E, index, n, picked);
  model_.lm_head(ctx_, picked, n, logits, n);  // one product: no offsets into device rows
  return logits;
}

Status DeviceHeadSampler::logits(int64_t first, int64_t n, float* out) {
  DC_CHECK(first >= 0 && n >= 0 && first + n <= n_rows_, "DeviceHeadSampler::logits: rows outside the forward's");
  if (n == 0) return Status::ok_status();
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(first + i);
  const std::unique_lock<std::mutex> lock = ctx_.backend->lock();
  DC_RETURN_IF_ERROR(ctx_.backend->begin());
  const float* logits = record_logits(rows);
  DC_RETURN_IF_ERROR(ctx_.backend->finish());
  return ctx_.backend->download(logits, out, n * model_.config().n_vocab * static_cast<int64_t>(sizeof(float)));
}

Status DeviceHeadSampler::sample(const HeadSampling& args, std::span<TokenSample> out) {
  const std::span<const HeadRow> rows = args.rows;
  DC_CHECK(out.size() == rows.size(), "DeviceHeadSampler::sample: out and rows differ in size");
  if (rows.empty()) return Status::ok_status();
  const int64_t first = rows.front().hidden_row, last = rows.back().hidden_row, V = model_.config().n_vocab;
  DC_CHECK(first >= 0 && last < n_rows_, "DeviceHeadSampler::sample: rows outside the forward's");
  if (!samples_on_device(args.filter)) {  // the rows' logits on the host, sampled as the CPU samples them
    std::vector<float> block;
    try {
      block.resize(static_cast<size_t>((last + 1 - first) * V));
    } catch (const std::bad_alloc&) {
      return resource_exhausted("lm_head: out of memory for the [" + std::to_string(last + 1 - first) + " × " +
                                std::to_string(V) + "] logits of a sampled step");
    }
    DC_RETURN_IF_ERROR(logits(first, last + 1 - first, block.data()));
    return sample_head_rows(args, 0, static_cast<int64_t>(rows.size()), block.data(), first, V, ctx_.pool, out);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> index(rows.size());
  for (size_t e = 0; e < rows.size(); ++e) index[e] = static_cast<int32_t>(rows[e].hidden_row);
  std::vector<int32_t> ids(rows.size());
  std::vector<float> conf(rows.size() * 3);
  {
    const std::unique_lock<std::mutex> lock = ctx_.backend->lock();
    DC_RETURN_IF_ERROR(ctx_.backend->begin());
    const float* logits = record_logits(index);
    int32_t* ids_at = static_cast<int32_t*>(ctx_.backend->alloc("head.ids", n * 4));
    float* conf_at = device_floats(ctx_, "head.conf", n * 3);
    if (logits != nullptr && device_status(ctx_).ok()) ctx_.backend->row_confidence(logits, n, V, ids_at, conf_at);
    DC_RETURN_IF_ERROR(ctx_.backend->finish());
    DC_RETURN_IF_ERROR(ctx_.backend->download(ids_at, ids.data(), n * 4));
    DC_RETURN_IF_ERROR(ctx_.backend->download(conf_at, conf.data(), n * 12));
  }
  const int kind = args.kind == ConfidenceKind::kProbability ? 0 : args.kind == ConfidenceKind::kMargin ? 1 : 2;
  for (size_t e = 0; e < rows.size(); ++e) {
    if (!std::isfinite(conf[e * 3 + kind]))
      return invalid_argument("step " + std::to_string(args.step) + ", row " + std::to_string(rows[e].row) + ", position " +
                              std::to_string(rows[e].position) + ": the logits are not finite (or all −inf)");
    out[e] = TokenSample{ids[e], conf[e * 3 + kind]};
  }
  return Status::ok_status();
}

}  // namespace dc
