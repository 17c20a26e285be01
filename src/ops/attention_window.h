// Bidirectional GQA attention for a window of queries over every key of the sequence (the KV-cache
// forward: the window's queries, the whole sequence's keys and values from the cache), and the window's
// K/V written into the cache.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "ops/attention.h"

namespace dc {

// out[B, W, n_head, head_dim] = softmax(q·kᵀ / sqrt(head_dim)) · v per head for the W = window_len
// queries at absolute positions [window_begin, window_begin + W) of each row, over all L = shape.n_seq
// keys: query i (absolute position window_begin + i) of row b attends key j iff valid[b, window_begin + i]
// && valid[b, j] (valid: [B, L], nullptr = every pair) — the padding rule of attention(). A query with
// no key to attend gets a zero output. q: [B, W, n_head, head_dim]; k, v: [B, L, n_head_kv, head_dim].
// With window_begin = 0 and W = L this computes exactly what attention() computes with the same
// context (same kernel family, same per-row arithmetic). Precondition: 0 <= window_begin, window_begin + W <= L. Never materialises W×L.
// With `positions` ([W], ascending, inside [window_begin, L); the same in every row) query i is at absolute
// position positions[i] instead of window_begin + i (the scattered rows of a `--cache committed` step; CPU only).
void attention_window(const Context& ctx, const AttentionShape& shape, int64_t window_begin, int64_t window_len,
                      const float* q, const float* k, const float* v, const uint8_t* valid, float* out,
                      const int64_t* positions = nullptr);

// RoPE (ops/elementwise.h rope_apply, cos / sin [n, head_dim/2]) in place on the step's q [n, n_head, head_dim]
// and k [n, n_head_kv, head_dim], n = n_batch · window_len; then, when cache_k is not null, kv_store of the
// rotated k and of v [n, n_head_kv · head_dim] into cache_k / cache_v [n_batch, n_seq, n_head_kv · head_dim] at
// [window_begin, window_begin + window_len), or at positions[i] (kv_store's) (shape: n_batch, n_seq and the heads).
// One pass on a device; on the CPU those calls, in that order.
void rope_kv(const Context& ctx, const AttentionShape& shape, int64_t window_begin, int64_t window_len, float* q, float* k,
             const float* v, const float* cos, const float* sin, float* cache_k, float* cache_v,
             const int64_t* positions = nullptr);

// The window's fresh keys or values into the cache: cache[b, window_begin + i, :] = src[b, i, :] for i < W =
// window_len, b < n_batch; src [n_batch, W, cols], cache [n_batch, n_seq, cols]; the other positions are
// untouched. Precondition: 0 <= window_begin, window_begin + W <= n_seq. With `positions` ([W], each in
// [window_begin, n_seq); CPU only): cache[b, positions[i], :] = src[b, i, :] instead.
void kv_store(const Context& ctx, const float* src, int64_t n_batch, int64_t n_seq, int64_t window_begin,
              int64_t window_len, int64_t cols, float* cache, const int64_t* positions = nullptr);

}  // namespace dc
