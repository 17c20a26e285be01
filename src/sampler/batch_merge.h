// Several ForwardBatches as one forward: the rows of each part stacked and left-padded to the widest
// canvas, as the server's continuous batching does for its decoders (and Coupled-GRPO rollouts will).
// A pure function of its inputs, so a part's logits do not depend on its batch mates beyond padding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "types/forward_batch.h"

namespace dc {

// The merged tokens, padding, positions and logit rows; batch() views them (valid while this lives and
// is not modified). Part p's logits are rows [out_begin[p], out_begin[p + 1]) of the merged forward's.
struct MergedBatch {
  int64_t n_batch = 0, n_seq = 0;   // rows of all parts; the widest part's n_seq
  std::vector<int32_t> tokens;      // [n_batch, n_seq]; a pad position holds 0
  std::vector<uint8_t> valid;       // [n_batch, n_seq]; empty when no part is padded or has padding
  std::vector<int32_t> positions;   // [n_batch, n_seq]; empty with `valid`; a pad position holds 1
  std::vector<int64_t> out_rows;    // the parts' out_rows, moved to their merged rows and columns
  std::vector<int64_t> out_begin;   // [n_parts + 1]

  ForwardBatch batch() const;
};

// Stacks `parts` (each with cache_op kNone and the whole sequence as its window; invalid_argument
// otherwise, or when there is no part): part p's rows follow those of parts < p, each row shifted right
// by (widest n_seq − its n_seq) pad positions. Positions default to 0..n_seq−1 within each part and valid
// to 1; both are emitted only when some row is padded or some part has its own padding.
Result<MergedBatch> merge_left_padded(std::span<const ForwardBatch> parts);

}  // namespace dc
