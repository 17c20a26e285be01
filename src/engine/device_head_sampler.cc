// DeviceHeadSampler: the hidden rows, the logits block and every step's sampling on the device.
#include "engine/device_head_sampler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/check.h"
#include "ops/elementwise.h"
#include "sampler/rng.h"

namespace dc {

Status DeviceHeadSampler::forward(std::span<const ForwardBatch> parts) {
  DC_RETURN_IF_ERROR(run_pending());
  n_rows_ = 0;
  DC_RETURN_IF_ERROR(model_.check_forward(ctx_, parts));
  const int64_t E = model_.config().n_embd;
  int64_t n_out = 0;
  for (const ForwardBatch& b : parts) n_out += b.n_out;
  if (n_out > capacity_rows_) {
    hidden_.reset();
    capacity_rows_ = 0;
    const std::unique_lock<std::mutex> lock = ctx_.backend->lock();  // allocate() runs under the device's lock
    DC_ASSIGN_OR_RETURN(hidden_, ctx_.backend->allocate(n_out * E * static_cast<int64_t>(sizeof(float)),
                                                         "the hidden rows of " + std::to_string(n_out) + " positions"));
    capacity_rows_ = n_out;
  }
  PendingForward& pending = pending_.emplace();
  pending.parts.resize(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const ForwardBatch& batch = parts[i];
    PendingPart& p = pending.parts[i];
    const size_t n = static_cast<size_t>(batch.n_batch * batch.n_seq);
    p.batch = batch;
    p.tokens.assign(batch.tokens, batch.tokens + n);
    p.batch.tokens = p.tokens.data();
    if (batch.positions != nullptr) p.positions.assign(batch.positions, batch.positions + n), p.batch.positions = p.positions.data();
    if (batch.valid != nullptr) p.valid.assign(batch.valid, batch.valid + n), p.batch.valid = p.valid.data();
    p.out_rows.assign(batch.out_rows, batch.out_rows + batch.n_out);
    p.batch.out_rows = p.out_rows.data();
  }
  n_rows_ = n_out;
  return Status::ok_status();
}

std::vector<ForwardBatch> DeviceHeadSampler::PendingForward::batches() const {
  std::vector<ForwardBatch> out;
  for (const PendingPart& p : parts) out.push_back(p.batch);
  return out;
}

Status DeviceHeadSampler::record_pending() {
  if (!pending_) return Status::ok_status();
  const Status s = model_.record_hidden(ctx_, pending_->batches(), hidden_ != nullptr ? as_operand(hidden_->data()) : nullptr);
  if (!s.ok()) drop_pending(false);
  return s;
}

Status DeviceHeadSampler::finish_step() {
  const Status s = ctx_.backend->finish();
  drop_pending(s.ok());
  return s;
}

void DeviceHeadSampler::drop_pending(bool ran) {
  if (!ran && pending_)
    for (const PendingPart& p : pending_->parts)
      if (p.batch.cache != nullptr && p.batch.cache_op == CacheOp::kRefresh) p.batch.cache->set_filled(false);  // recorded (maybe in part), not run
  pending_.reset();
}

Status DeviceHeadSampler::run_pending() {
  if (!pending_) return Status::ok_status();
  const std::unique_lock<std::mutex> lock = ctx_.backend->lock();
  DC_RETURN_IF_ERROR(ctx_.backend->begin());
  DC_RETURN_IF_ERROR(record_pending());
  return finish_step();
}

void DeviceHeadSampler::release() {
  // Going idle: the rows are not read again, but the forward may refresh the cache (on an error it is left unfilled).
  static_cast<void>(run_pending());
  hidden_.reset();
  logits_.reset();
  capacity_rows_ = logits_capacity_ = n_rows_ = 0;
}

Status DeviceHeadSampler::reserve_logits(int64_t n) {
  n = std::max(n, kMinHeadRows);
  const int64_t V = model_.config().n_vocab;
  if (n * V <= logits_capacity_) return Status::ok_status();
  logits_.reset();
  logits_capacity_ = 0;
  DC_ASSIGN_OR_RETURN(logits_, ctx_.backend->allocate(n * V * static_cast<int64_t>(sizeof(float)),
                                                      "the [" + std::to_string(n) + " × " + std::to_string(V) +
                                                          "] logits of a step"));
  logits_capacity_ = n * V;
  return Status::ok_status();
}

DeviceIn DeviceHeadSampler::record_logits(std::vector<int32_t> rows) {
  if (static_cast<int64_t>(rows.size()) < kMinHeadRows) rows.resize(kMinHeadRows, rows.back());
  const int64_t n = static_cast<int64_t>(rows.size()), E = model_.config().n_embd;
  const int32_t* index = device_copy(ctx_, "head.index", rows.data(), n);
  float* picked = device_floats(ctx_, "head.rows", n * E);  // [n, E]
  if (!device_status(ctx_).ok()) return nullptr;
  gather_rows(ctx_, as_operand(hidden_->data()), E, index, n, picked);
  model_.lm_head(ctx_, picked, n, as_operand(logits_->data()), n);  // one product: no offsets into device rows
  return logits_->data();
}

Status DeviceHeadSampler::logits(int64_t first, int64_t n, float* out) {
  DC_CHECK(first >= 0 && n >= 0 && first + n <= n_rows_, "DeviceHeadSampler::logits: rows outside the forward's");
  if (n == 0) return Status::ok_status();
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(first + i);
  const std::unique_lock<std::mutex> lock = ctx_.backend->lock();
  DC_RETURN_IF_ERROR(reserve_logits(n));
  DC_RETURN_IF_ERROR(ctx_.backend->begin());
  DC_RETURN_IF_ERROR(record_pending());
  const DeviceIn logits = record_logits(std::move(rows));
  if (logits) ctx_.backend->copy_out("head.logits", logits, out, n * model_.config().n_vocab * static_cast<int64_t>(sizeof(float)));
  return finish_step();
}

Status DeviceHeadSampler::sample_parts(std::span<const HeadSampling> parts, std::span<TokenSample> out,
                                       std::span<Status> status) {
  DC_CHECK(status.size() == parts.size(), "DeviceHeadSampler::sample_parts: a status per part");
  std::vector<int32_t> index;     // [n] every entry's hidden row, the parts one after the other
  std::vector<float> uniforms;    // [n] the CPU's one draw per entry (sample_categorical's)
  std::vector<int64_t> begin{0};  // [parts + 1] part p's entries are [begin[p], begin[p + 1])
  for (size_t p = 0; p < parts.size(); ++p) {
    const HeadSampling& args = parts[p];
    status[p] = Status::ok_status();
    for (const HeadRow& r : args.rows) {
      DC_CHECK(r.hidden_row >= 0 && r.hidden_row < n_rows_, "DeviceHeadSampler::sample_parts: rows outside the forward's");
      index.push_back(static_cast<int32_t>(r.hidden_row));
      float u = 0.0f;
      if (args.filter.temperature > 0.0f) {
        Rng rng = Rng::for_stream(args.seed, RngPurpose::kToken, args.step, r.row, r.position);
        u = std::min(static_cast<float>(rng.uniform_double()), std::nextafter(1.0f, 0.0f));  // [0, 1) in f32
      }
      uniforms.push_back(u);
    }
    begin.push_back(static_cast<int64_t>(index.size()));
  }
  DC_CHECK(out.size() == index.size(), "DeviceHeadSampler::sample_parts: out and the parts' rows differ in size");
  if (index.empty()) return Status::ok_status();
  const int64_t n = static_cast<int64_t>(index.size()), V = model_.config().n_vocab;
  std::vector<int32_t> ids(index.size());
  std::vector<float> conf(index.size() * 3);
  {
    const std::unique_lock<std::mutex> lock = ctx_.backend->lock();
    DC_RETURN_IF_ERROR(reserve_logits(n));
    DC_RETURN_IF_ERROR(ctx_.backend->begin());
    DC_RETURN_IF_ERROR(record_pending());  // the step's forward, lm_head and sampling: one submission
    const DeviceIn logits = record_logits(std::move(index));  // one product over every part's rows
    const DeviceIn u = device_cast<const float>(ctx_.backend->copy_in("head.uniforms", uniforms.data(), n * 4));
    const DevicePtr<int32_t> ids_at = device_cast<int32_t>(ctx_.backend->alloc("head.ids", n * 4));
    const DeviceOut conf_at = device_cast<float>(ctx_.backend->alloc("head.conf", n * 12));
    if (logits && device_status(ctx_).ok()) {
      for (size_t p = 0; p < parts.size(); ++p) {  // each part's rows with its own filters (operands at its offset)
        const int64_t at = begin[p], rows = begin[p + 1] - begin[p];
        if (rows == 0) continue;
        ctx_.backend->sample_rows(as_device(as_operand(logits) + at * V), rows, V, parts[p].filter, as_device(as_operand(u) + at),
                                  as_device(as_operand(ids_at) + at), as_device(as_operand(conf_at) + at * 3));
      }
      ctx_.backend->copy_out("head.ids", ids_at, ids.data(), n * 4);  // one submission with the step's kernels
      ctx_.backend->copy_out("head.conf", conf_at, conf.data(), n * 12);
    }
    DC_RETURN_IF_ERROR(finish_step());
  }
  for (size_t p = 0; p < parts.size(); ++p) {
    const HeadSampling& args = parts[p];
    const int kind = args.kind == ConfidenceKind::kProbability ? 0 : args.kind == ConfidenceKind::kMargin ? 1 : 2;
    for (int64_t e = begin[p]; e < begin[p + 1]; ++e) {
      const HeadRow& r = args.rows[static_cast<size_t>(e - begin[p])];
      if (!std::isfinite(conf[e * 3 + kind])) {
        status[p] = invalid_argument("step " + std::to_string(args.step) + ", row " + std::to_string(r.row) + ", position " +
                                     std::to_string(r.position) + ": the logits are not finite (or all −inf)" +
                                     (args.filter.temperature > 0.0f ? " after dividing by temperature" : ""));
        break;
      }
      out[static_cast<size_t>(e)] = TokenSample{ids[e], conf[e * 3 + kind]};
    }
  }
  return Status::ok_status();
}

}  // namespace dc
