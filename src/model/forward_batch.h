// ForwardBatch: what one forward pass of the model reads (tokens, positions, padding) and which
// rows of logits it must produce. Shared by the model, the sampler and (later) the trainer.
#pragma once

#include <cstdint>

namespace dc {

struct ForwardBatch {
  int64_t n_batch = 0;
  int64_t n_seq = 0;
  const int32_t* tokens = nullptr;     // [n_batch, n_seq] token ids
  const int32_t* positions = nullptr;  // [n_batch, n_seq] RoPE position ids; nullptr = 0..n_seq-1 per row
  const uint8_t* valid = nullptr;      // [n_batch, n_seq] 1 = real token, 0 = padding; nullptr = all real
                                       // (query i attends key j iff valid[i] && valid[j]; rows with no
                                       // valid key get a zero attention output)
  const int64_t* out_rows = nullptr;   // [n_out] flat indices b * n_seq + i whose logits are wanted
  int64_t n_out = 0;
};

}  // namespace dc
