// The left-padded batches the device model tests run (forward_vulkan_test.cc, backward_vulkan_test.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "types/forward_batch.h"

namespace dc {

// A left-padded batch of `B` rows of L positions (row r has r pad positions on the left, its real
// positions numbered from 0), ids drawn from [0, n_vocab), every real row's logits asked for.
struct Batch {
  int64_t B = 0, L = 0;
  std::vector<int32_t> tokens, positions;
  std::vector<uint8_t> valid;
  std::vector<int64_t> rows;
  ForwardBatch view() const {
    ForwardBatch b;
    b.n_batch = B, b.n_seq = L;
    b.tokens = tokens.data(), b.positions = positions.data(), b.valid = valid.data();
    b.out_rows = rows.data(), b.n_out = static_cast<int64_t>(rows.size());
    return b;
  }
};

inline Batch left_padded(int64_t B, int64_t L, int64_t n_vocab, uint32_t seed) {
  Batch k;
  k.B = B, k.L = L;
  for (int64_t r = 0; r < B; ++r)
    for (int64_t i = 0; i < L; ++i) {
      const bool real = i >= r;
      seed = seed * 1664525u + 1013904223u;
      k.tokens.push_back(static_cast<int32_t>((seed >> 8) % n_vocab));
      k.positions.push_back(real ? static_cast<int32_t>(i - r) : 0);
      k.valid.push_back(real ? 1 : 0);
      if (real) k.rows.push_back(r * L + i);
    }
  return k;
}

}  // namespace dc
