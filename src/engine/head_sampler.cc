// CpuHeadSampler: the forward to hidden rows, then lm_head and sampling chunk by chunk.
#include "engine/head_sampler.h"

#include <algorithm>
#include <new>
#include <string>

#include "core/check.h"
#include "core/profiler.h"
#include "sampler/filters.h"

namespace dc {

CpuHeadSampler::CpuHeadSampler(const Model& model, const Context& ctx, int64_t chunk_rows)
    : model_(model), ctx_(ctx), chunk_rows_(chunk_rows) {
  DC_CHECK(chunk_rows > 0, "CpuHeadSampler: chunk_rows must be positive");
  ctx_.workspace = &workspace_;
}

Status CpuHeadSampler::forward(std::span<const ForwardBatch> parts) {
  n_rows_ = 0;
  int64_t n_out = 0;
  for (const ForwardBatch& b : parts) n_out += std::max<int64_t>(b.n_out, 0);
  try {
    hidden_.resize(static_cast<size_t>(n_out * model_.config().n_embd));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("forward: out of memory for the hidden rows of " + std::to_string(n_out) + " positions");
  }
  DC_RETURN_IF_ERROR(parts.size() == 1 ? model_.forward_hidden(ctx_, parts[0], hidden_.data())
                                       : model_.forward_hidden_parts(ctx_, parts, hidden_.data()));
  n_rows_ = n_out;
  return Status::ok_status();
}

void CpuHeadSampler::release() {
  workspace_.release();
  std::vector<float>().swap(hidden_);
  n_rows_ = 0;
}

Status CpuHeadSampler::logits(int64_t first, int64_t n, float* out) {
  DC_CHECK(first >= 0 && n >= 0 && first + n <= n_rows_, "CpuHeadSampler::logits: rows outside the forward's");
  try {
    const ProfileScope profile(ctx_, "lm_head");
    model_.lm_head(ctx_, hidden_.data() + first * model_.config().n_embd, n, out, chunk_rows_);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("lm_head: out of memory for the kernels' scratch of " + std::to_string(n) + " rows");
  }
  return Status::ok_status();
}

Status CpuHeadSampler::sample_parts(std::span<const HeadSampling> parts, std::span<TokenSample> out,
                                    std::span<Status> status) {
  DC_CHECK(status.size() == parts.size(), "CpuHeadSampler::sample_parts: a status per part");
  std::vector<std::span<TokenSample>> outs;  // part p's share of out
  int64_t first = -1, last = -1;             // the hidden rows of the first and the last entry
  size_t total = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const std::span<const HeadRow> rows = parts[p].rows;
    status[p] = Status::ok_status();
    DC_CHECK(total + rows.size() <= out.size(), "CpuHeadSampler::sample_parts: out is smaller than the parts' rows");
    outs.push_back(out.subspan(total, rows.size()));
    total += rows.size();
    if (rows.empty()) continue;
    DC_CHECK(rows.front().hidden_row > last, "CpuHeadSampler::sample_parts: the parts' rows are not in ascending hidden rows");
    if (first < 0) first = rows.front().hidden_row;
    last = rows.back().hidden_row;
  }
  DC_CHECK(total == out.size(), "CpuHeadSampler::sample_parts: out and the parts' rows differ in size");
  if (first < 0) return Status::ok_status();
  DC_CHECK(last < n_rows_, "CpuHeadSampler::sample_parts: rows outside the forward's");
  const int64_t E = model_.config().n_embd, V = model_.config().n_vocab;
  size_t p = 0;   // the next entry to sample: parts[p].rows[e]
  int64_t e = 0;
  const auto skip_finished_parts = [&] {
    while (p < parts.size() && e == static_cast<int64_t>(parts[p].rows.size())) ++p, e = 0;
  };
  skip_finished_parts();
  try {
    float* block = workspace_.floats("head.logits", std::min(chunk_rows_, last + 1 - first) * V);  // [chunk, V]
    for (int64_t c0 = first; c0 <= last && p < parts.size(); c0 += chunk_rows_) {
      const int64_t c1 = std::min(c0 + chunk_rows_, last + 1);
      if (parts[p].rows[e].hidden_row >= c1) continue;  // no position reads this chunk
      {
        const ProfileScope profile(ctx_, "lm_head");
        model_.lm_head(ctx_, hidden_.data() + c0 * E, c1 - c0, block, chunk_rows_);
      }
      const ProfileScope profile(ctx_, "sampling");
      while (p < parts.size() && parts[p].rows[e].hidden_row < c1) {  // each part's entries of this chunk
        const std::span<const HeadRow> rows = parts[p].rows;
        const int64_t e_begin = e;
        while (e < static_cast<int64_t>(rows.size()) && rows[e].hidden_row < c1) ++e;
        if (status[p].ok()) status[p] = sample_head_rows(parts[p], e_begin, e, block, c0, V, ctx_.pool, outs[p]);
        skip_finished_parts();
      }
    }
  } catch (const std::bad_alloc&) {
    return resource_exhausted("lm_head: out of memory for the [" + std::to_string(chunk_rows_) + " × " +
                              std::to_string(V) + "] logits block or the kernels' scratch");
  }
  return Status::ok_status();
}

}  // namespace dc
