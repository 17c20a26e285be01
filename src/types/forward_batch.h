// ForwardBatch: what one forward pass of the model reads (tokens, positions, padding), which positions
// it computes (a window, with a KV cache), and which rows of logits it must produce. Written by the
// sampler (and the server's batching, the trainer), read by the model.
#pragma once

#include <cstdint>

namespace dc {

class KvCache;
struct LoraWeights;  // model/lora_weights.h

// What a forward does with a KvCache (Fast-dLLM block decoding, spec §6).
enum class CacheOp {
  kNone,     // no cache: every position is computed, attending every position (the window must be all)
  kRefresh,  // a full pass (the window must be all) that also stores the K (after RoPE) and V of every
             // position of every layer in `cache`, sizing it on first use; its logits equal kNone's
  kUse,      // computes only the window's positions; their K/V overwrite the cache at those positions and
             // the window's queries attend the K/V of ALL positions read from the cache (the positions
             // outside the window keep the K/V of the last refresh: the approximation). Needs a cache
             // filled by a refresh of the same shape
};

struct ForwardBatch {
  int64_t n_batch = 0;
  int64_t n_seq = 0;
  const int32_t* tokens = nullptr;     // [n_batch, n_seq] token ids
  const int32_t* positions = nullptr;  // [n_batch, n_seq] RoPE position ids; nullptr = 0..n_seq-1 per row
  const uint8_t* valid = nullptr;      // [n_batch, n_seq] 1 = real token, 0 = padding; nullptr = all real
                                       // (query i attends key j iff valid[i] && valid[j]; rows with no
                                       // valid key get a zero attention output)
  const int64_t* out_rows = nullptr;   // [n_out] flat indices b * n_seq + i whose logits are wanted; with a
                                       // window, window_begin <= i < window_end
  int64_t n_out = 0;
  // Positions [window_begin, window_end) of every row are computed (window_end -1 = n_seq). A window
  // smaller than the sequence needs cache_op kUse.
  int64_t window_begin = 0;
  int64_t window_end = -1;
  // With kUse, optionally only some positions of the window are computed (`--cache committed`: the
  // block's masked and newly committed positions): [n_window_positions] ascending inside [window_begin,
  // window_stop()), the same in every row; their K/V overwrite the cache there and every other position's
  // K/V are read from it. nullptr = every position of the window. CPU only (a device refuses it).
  const int64_t* window_positions = nullptr;
  int64_t n_window_positions = 0;
  // With window_positions, optionally a list per row: row b computes window_positions[window_row_begin[b],
  // window_row_begin[b + 1]) (ascending inside the window; possibly none), [n_batch + 1] from 0 up to
  // n_window_positions. nullptr = window_positions is every row's list.
  const int64_t* window_row_begin = nullptr;
  CacheOp cache_op = CacheOp::kNone;
  KvCache* cache = nullptr;  // not owned; required unless cache_op is kNone. The sampler leaves it null
                             // and the LogitsFn (e.g. Engine::logits_fn) supplies its own cache
  // Unmerged LoRA adapters added to every row's projections (not owned; null: none). CPU only.
  const LoraWeights* lora = nullptr;

  int64_t window_stop() const { return window_end < 0 ? n_seq : window_end; }
  // Positions computed per row when every row computes the same (no window_row_begin): the window's, or
  // n_window_positions.
  int64_t window_width() const { return window_positions != nullptr ? n_window_positions : window_stop() - window_begin; }
  // Positions computed in row b, and where they start among the forward's computed positions (row-major:
  // row b's after those of rows < b).
  int64_t row_width(int64_t b) const {
    return window_row_begin != nullptr ? window_row_begin[b + 1] - window_row_begin[b] : window_width();
  }
  int64_t row_first(int64_t b) const { return window_row_begin != nullptr ? window_row_begin[b] : b * window_width(); }
  // Row b's computed positions ([row_width(b)] ascending), or nullptr when it computes the window's every position.
  const int64_t* row_positions(int64_t b) const {
    return window_row_begin != nullptr ? window_positions + window_row_begin[b] : window_positions;
  }
  // Positions computed by this forward over all rows: Σ_b row_width(b).
  int64_t n_computed() const { return window_row_begin != nullptr ? n_window_positions : n_batch * window_width(); }
};

}  // namespace dc
