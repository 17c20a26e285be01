// Fused log-softmax + cross-entropy over the vocabulary, forward and backward in one pass, for the
// rows that carry a loss only (training).
#pragma once

#include <cstdint>

#include "core/context.h"

namespace dc {

// For each row r of logits[n, n_vocab]: CE_r = logsumexp(logits[r]) − logits[r, targets[r]].
// Returns Σ_r weights[r]·CE_r (accumulated in double) and, when dlogits != nullptr, overwrites
//   dlogits[r, :] = weights[r] · (softmax(logits[r]) − onehot(targets[r]))
// dlogits may alias logits. ce (optional, [n]) receives the unweighted CE_r.
// Precondition: 0 <= targets[r] < n_vocab (the caller checks outside input). The CPU only: its result is a
// host number (on a device, cross_entropy_rows).
double cross_entropy(const Context& ctx, const float* logits, const int32_t* targets, const float* weights,
                     int64_t n, int64_t n_vocab, float* dlogits, float* ce = nullptr);

// cross_entropy on either device, every operand in ctx's memory (on a device nothing crosses to the host):
// loss[0] = Σ_r weights[r]·CE_r in f32 (the CPU's double sum rounded; a device sums the f32 rows in a fixed
// order), ce [n] (nullptr: not wanted) and dlogits (nullptr: not wanted; may alias logits) as cross_entropy's.
void cross_entropy_rows(const Context& ctx, const float* logits, const int32_t* targets, const float* weights, int64_t n,
                        int64_t n_vocab, float* dlogits, float* ce, float* loss);

}  // namespace dc
