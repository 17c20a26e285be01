// merge_left_padded: the server's one-forward-per-step batch of several decoders.
#include "sampler/batch_merge.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace dc {

ForwardBatch MergedBatch::batch() const {
  ForwardBatch b;
  b.n_batch = n_batch;
  b.n_seq = n_seq;
  b.tokens = tokens.data();
  b.valid = valid.empty() ? nullptr : valid.data();
  b.positions = positions.empty() ? nullptr : positions.data();
  b.out_rows = out_rows.data();
  b.n_out = static_cast<int64_t>(out_rows.size());
  return b;
}

Result<MergedBatch> merge_left_padded(std::span<const ForwardBatch> parts) {
  if (parts.empty()) return invalid_argument("merge_left_padded: no batch to merge");
  MergedBatch m;
  int64_t n_out = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const ForwardBatch& fb = parts[p];
    if (fb.cache_op != CacheOp::kNone || fb.window_begin != 0 || fb.window_stop() != fb.n_seq)
      return invalid_argument("merge_left_padded: part " + std::to_string(p) +
                              " uses a KV cache or a window; only whole-sequence forwards merge");
    m.n_batch += fb.n_batch;
    m.n_seq = std::max(m.n_seq, fb.n_seq);
    n_out += fb.n_out;
  }
  const int64_t width = m.n_seq;
  const size_t size = static_cast<size_t>(m.n_batch * width);
  m.tokens.assign(size, 0);
  std::vector<uint8_t> valid(size, 0);
  std::vector<int32_t> positions(size, 1);
  m.out_rows.reserve(static_cast<size_t>(n_out));
  m.out_begin.push_back(0);
  bool padded = false;
  int64_t row0 = 0;
  for (const ForwardBatch& fb : parts) {
    const int64_t pad = width - fb.n_seq;
    padded |= pad > 0 || fb.valid != nullptr;
    for (int64_t b = 0; b < fb.n_batch; ++b) {
      const size_t dst = static_cast<size_t>((row0 + b) * width + pad);
      const size_t src = static_cast<size_t>(b * fb.n_seq);
      std::memcpy(m.tokens.data() + dst, fb.tokens + src, static_cast<size_t>(fb.n_seq) * sizeof(int32_t));
      for (int64_t j = 0; j < fb.n_seq; ++j) {
        valid[dst + j] = fb.valid != nullptr ? fb.valid[src + j] : 1;
        positions[dst + j] = fb.positions != nullptr ? fb.positions[src + j] : static_cast<int32_t>(j);
      }
    }
    for (int64_t o = 0; o < fb.n_out; ++o) {
      const int64_t b = fb.out_rows[o] / fb.n_seq, j = fb.out_rows[o] % fb.n_seq;
      m.out_rows.push_back((row0 + b) * width + pad + j);
    }
    m.out_begin.push_back(static_cast<int64_t>(m.out_rows.size()));
    row0 += fb.n_batch;
  }
  if (padded) {
    m.valid = std::move(valid);
    m.positions = std::move(positions);
  }
  return m;
}

}  // namespace dc
