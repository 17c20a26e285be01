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
// Precondition: 0 <= targets[r] < n_vocab (the caller checks outside input).
double cross_entropy(const Context& ctx, const float* logits, const int32_t* targets, const float* weights,
                     int64_t n, int64_t n_vocab, float* dlogits, float* ce = nullptr);

}  // namespace dc
