// The canvases of the KV-cache and forward-of-parts tests (tests/model/kv_cache_test.cc, on the CPU, and
// tests/model/vulkan/parts_vulkan_test.cc, on a device): a batch of B rows of L positions with the sampler's
// left padding, and its ForwardBatch over a window with a cache op.
#pragma once

#include <cstdint>
#include <vector>

#include "model/kv_cache.h"
#include "types/forward_batch.h"
#include "types/model_config.h"

namespace dc {

struct Canvas {
  int64_t B = 0, L = 0;
  std::vector<int32_t> tokens, positions;
  std::vector<uint8_t> valid;
};

// Row 0: a full row; row 1 (when B = 2): 3 left pads, positions as the sampler builds them.
inline Canvas make_canvas(const ModelConfig& c, int64_t B, int64_t L, uint32_t seed) {
  Canvas k;
  k.B = B;
  k.L = L;
  for (int64_t i = 0; i < B * L; ++i)
    k.tokens.push_back(static_cast<int32_t>((seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 300u));
  if (B > 1) {
    k.valid.assign(B * L, 1);
    k.positions.resize(B * L);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pads = b == 1 ? 3 : 0;
      for (int64_t i = 0; i < L; ++i) {
        k.valid[b * L + i] = i >= pads;
        k.positions[b * L + i] = static_cast<int32_t>(i >= pads ? i - pads : 1);
        if (i < pads) k.tokens[b * L + i] = static_cast<int32_t>(c.pad_token_id);
      }
    }
  }
  return k;
}

inline ForwardBatch cache_batch_of(const Canvas& k, const std::vector<int64_t>& rows, CacheOp op, KvCache* cache,
                                   int64_t wb = 0, int64_t we = -1) {
  ForwardBatch b;
  b.n_batch = k.B;
  b.n_seq = k.L;
  b.tokens = k.tokens.data();
  b.positions = k.positions.empty() ? nullptr : k.positions.data();
  b.valid = k.valid.empty() ? nullptr : k.valid.data();
  b.out_rows = rows.data();
  b.n_out = static_cast<int64_t>(rows.size());
  b.cache_op = op;
  b.cache = cache;
  b.window_begin = wb;
  b.window_end = we;
  return b;
}

// The real rows of [wb, we) of every batch row.
inline std::vector<int64_t> window_rows(const Canvas& k, int64_t wb, int64_t we) {
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < k.B; ++b)
    for (int64_t i = wb; i < we; ++i)
      if (k.valid.empty() || k.valid[b * k.L + i]) rows.push_back(b * k.L + i);
  return rows;
}

}  // namespace dc
