// Test doubles for the sampler: a LogitsFn built from a per-row function of (batch, row, index) that
// records every ForwardBatch it receives (cache ops and windows are recorded, not applied: the fake always
// computes exact logits), plus a small hash for pseudo-random but deterministic logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "sampler/generate.h"
#include "types/forward_batch.h"

namespace dc::testing {

// The vocabulary of most sampler tests: 16 tokens, the last two the mask and the pad token.
inline constexpr int64_t kVocab = 16;
inline constexpr int32_t kMask = 15;
inline constexpr int32_t kPad = 14;

// A copy of a ForwardBatch (the pointers are only valid during the call).
struct RecordedBatch {
  int64_t n_batch = 0, n_seq = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;  // empty when the batch had nullptr
  std::vector<uint8_t> valid;      // empty when the batch had nullptr
  std::vector<int64_t> out_rows;
  bool has_positions = false, has_valid = false;
  CacheOp cache_op = CacheOp::kNone;
  int64_t window_begin = 0, window_end = 0;  // window_end resolved (never -1)
  std::vector<int64_t> window_positions;     // empty when the batch had nullptr
  std::vector<int64_t> window_row_begin;     // [n_batch + 1], empty when the batch had nullptr
};

// fn(batch, b, i, logits[n_vocab]) writes the model output for canvas row b, index i.
using RowFn = std::function<void(const ForwardBatch& batch, int64_t b, int64_t i, float* logits)>;

class FakeModel {
 public:
  FakeModel(int64_t n_vocab, RowFn fn) : state_(std::make_shared<State>()) {
    state_->n_vocab = n_vocab;
    state_->fn = std::move(fn);
  }

  LogitsFn logits_fn() const {
    auto state = state_;
    return [state](const ForwardBatch& batch, float* logits) -> Status {
      RecordedBatch r;
      r.n_batch = batch.n_batch;
      r.n_seq = batch.n_seq;
      const int64_t n = batch.n_batch * batch.n_seq;
      r.tokens.assign(batch.tokens, batch.tokens + n);
      r.has_positions = batch.positions != nullptr;
      r.has_valid = batch.valid != nullptr;
      if (r.has_positions) r.positions.assign(batch.positions, batch.positions + n);
      if (r.has_valid) r.valid.assign(batch.valid, batch.valid + n);
      r.out_rows.assign(batch.out_rows, batch.out_rows + batch.n_out);
      r.cache_op = batch.cache_op;
      r.window_begin = batch.window_begin;
      r.window_end = batch.window_stop();
      if (batch.window_positions != nullptr)
        r.window_positions.assign(batch.window_positions, batch.window_positions + batch.n_window_positions);
      if (batch.window_row_begin != nullptr)
        r.window_row_begin.assign(batch.window_row_begin, batch.window_row_begin + batch.n_batch + 1);
      state->batches.push_back(std::move(r));
      for (int64_t o = 0; o < batch.n_out; ++o) {
        const int64_t flat = batch.out_rows[o];
        state->fn(batch, flat / batch.n_seq, flat % batch.n_seq, logits + o * state->n_vocab);
      }
      return Status::ok_status();
    };
  }

  const std::vector<RecordedBatch>& batches() const { return state_->batches; }

 private:
  struct State {
    int64_t n_vocab = 0;
    RowFn fn;
    std::vector<RecordedBatch> batches;
  };
  std::shared_ptr<State> state_;
};

// A deterministic hash of a few integers to a float in [-1, 1).
inline float hash_unit(uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (a * 0xBF58476D1CE4E5B9ull);
  h ^= b + 0x94D049BB133111EBull + (h << 6) + (h >> 2);
  h ^= c * 0xD1B54A32D192ED03ull + (h << 7);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return static_cast<float>(h >> 40) * 0x1.0p-23f - 1.0f;
}

}  // namespace dc::testing
