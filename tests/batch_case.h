// The tests' forward batches: one owner of a batch's arrays (BatchCase) and its ForwardBatch view, built from a
// forward.json fixture case, as a left-padded random batch, as the sampler's canvas, or over every position of
// given tokens (the model, engine, LoRA, GGUF and trainer tests, on the CPU and on a device).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "fixtures.h"
#include "model/kv_cache.h"
#include "types/forward_batch.h"
#include "types/model_config.h"

namespace dc {

// A batch of B rows of L positions; the view points into these vectors, so it lives no longer than the case.
struct BatchCase {
  int64_t B = 0, L = 0;
  std::vector<int32_t> tokens;     // [B * L]
  std::vector<int32_t> positions;  // [B * L], or empty: 0..L-1 in every row
  std::vector<uint8_t> valid;      // [B * L], or empty: every position real
  std::vector<int64_t> rows;       // the flat rows whose logits view() asks for

  ForwardBatch view() const { return view(rows); }
  // The batch asking for `out_rows` (kept alive by the caller) with cache op `op` over the window [wb, we).
  ForwardBatch view(const std::vector<int64_t>& out_rows, CacheOp op = CacheOp::kNone, KvCache* cache = nullptr,
                    int64_t wb = 0, int64_t we = -1) const {
    ForwardBatch b;
    b.n_batch = B, b.n_seq = L;
    b.tokens = tokens.data();
    b.positions = positions.empty() ? nullptr : positions.data();
    b.valid = valid.empty() ? nullptr : valid.data();
    b.out_rows = out_rows.data(), b.n_out = static_cast<int64_t>(out_rows.size());
    b.cache_op = op, b.cache = cache;
    b.window_begin = wb, b.window_end = we;
    return b;
  }
  // A temporary's rows would dangle in the view.
  ForwardBatch view(const std::vector<int64_t>&&, CacheOp = CacheOp::kNone, KvCache* = nullptr, int64_t = 0,
                    int64_t = -1) const = delete;
};

// The real rows of [wb, we) of every batch row.
inline std::vector<int64_t> window_rows(const BatchCase& k, int64_t wb, int64_t we) {
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < k.B; ++b)
    for (int64_t i = wb; i < we; ++i)
      if (k.valid.empty() || k.valid[b * k.L + i]) rows.push_back(b * k.L + i);
  return rows;
}

// B rows of L positions, flat position i holding token_of(i), no padding, every position's logits asked for.
template <typename TokenOf>
BatchCase every_position(int64_t B, int64_t L, TokenOf token_of) {
  BatchCase k;
  k.B = B, k.L = L;
  for (int64_t i = 0; i < B * L; ++i) k.tokens.push_back(static_cast<int32_t>(token_of(i))), k.rows.push_back(i);
  return k;
}

// A case of a fixture's reference/forward.json (shape, input_ids, position_ids, attention_mask), every real
// position's logits asked for.
inline BatchCase forward_fixture_case(const nlohmann::json& c) {
  BatchCase k;
  k.B = c["shape"][0].get<int64_t>(), k.L = c["shape"][1].get<int64_t>();
  k.tokens = testing::flatten<int32_t>(c["input_ids"]);
  if (!c["position_ids"].is_null()) k.positions = testing::flatten<int32_t>(c["position_ids"]);
  if (!c["attention_mask"].is_null()) k.valid = testing::flatten<uint8_t>(c["attention_mask"]);
  k.rows = window_rows(k, 0, k.L);
  return k;
}

// A left-padded batch of `B` rows of L positions (row r has r pad positions on the left, its real
// positions numbered from 0), ids drawn from [0, n_vocab), every real row's logits asked for.
inline BatchCase left_padded(int64_t B, int64_t L, int64_t n_vocab, uint32_t seed) {
  BatchCase k;
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

// The KV-cache and forward-of-parts tests' canvas (tests/model/kv_cache_test.cc, on the CPU, and
// tests/model/vulkan/parts_vulkan_test.cc, on a device), no rows asked for (the tests pass their windows'):
// row 0 a full row; row 1 (when B = 2) 3 left pads, positions as the sampler builds them; B = 1: no positions
// and no valid mask.
inline BatchCase make_canvas(const ModelConfig& c, int64_t B, int64_t L, uint32_t seed) {
  BatchCase k;
  k.B = B, k.L = L;
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

}  // namespace dc
