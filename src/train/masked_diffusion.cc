// make_masked_batch: t per sequence, the mask draws, the shifted loss rows and their weights.
#include "train/masked_diffusion.h"

#include <string>

#include "train/rng.h"

namespace dc::train {

Result<MaskedBatch> make_masked_batch(const std::vector<TrainSequence>& seqs, const MaskingOptions& o, uint64_t key,
                                      int64_t n_vocab) {
  if (seqs.empty()) return invalid_argument("masked batch: no sequences");
  const int64_t B = static_cast<int64_t>(seqs.size()), L = static_cast<int64_t>(seqs[0].tokens.size());
  if (L == 0) return invalid_argument("masked batch: sequence 0 is empty");
  if (!o.fixed_t.empty() && static_cast<int64_t>(o.fixed_t.size()) != B)
    return invalid_argument("masked batch: fixed_t has " + std::to_string(o.fixed_t.size()) + " entries for " +
                            std::to_string(B) + " sequences");
  if (!(o.eps > 0 && o.eps < 1)) return invalid_argument("masked batch: eps must be in (0, 1)");
  if (!o.fixed_mask.empty() && static_cast<int64_t>(o.fixed_mask.size()) != B * L)
    return invalid_argument("masked batch: fixed_mask needs " + std::to_string(B * L) + " entries");
  MaskedBatch m;
  m.n_batch = B, m.n_seq = L;
  m.tokens.resize(B * L);
  m.t.resize(B);
  std::vector<int64_t> n_maskable(B, 0);
  for (int64_t b = 0; b < B; ++b) {
    const TrainSequence& s = seqs[b];
    if (static_cast<int64_t>(s.tokens.size()) != L || s.loss_mask.size() != s.tokens.size())
      return invalid_argument("masked batch: sequence " + std::to_string(b) + " has " +
                              std::to_string(s.tokens.size()) + " tokens and " + std::to_string(s.loss_mask.size()) +
                              " loss-mask entries; every sequence needs " + std::to_string(L) + " of both");
    for (int64_t j = 0; j < L; ++j) {
      if (s.tokens[j] < 0 || s.tokens[j] >= n_vocab)
        return invalid_argument("masked batch: sequence " + std::to_string(b) + " token " + std::to_string(j) +
                                " = " + std::to_string(s.tokens[j]) + " is outside the vocabulary");
      n_maskable[b] += s.loss_mask[j] != 0;
    }
    m.n_maskable += n_maskable[b];
  }
  for (int64_t b = 0; b < B; ++b) {
    const TrainSequence& s = seqs[b];
    const double t = o.fixed_t.empty() ? o.eps + (1 - o.eps) * uniform01(hash_counters(key, b, ~0ull)) : o.fixed_t[b];
    m.t[b] = t;
    const double z = o.norm == LossNorm::kTokens ? static_cast<double>(m.n_maskable)
                                                 : static_cast<double>(B) * static_cast<double>(n_maskable[b]);
    for (int64_t j = 0; j < L; ++j) {
      if (!o.fixed_mask.empty() && o.fixed_mask[b * L + j] && !s.loss_mask[j])
        return invalid_argument("masked batch: fixed_mask masks prompt position " + std::to_string(j) +
                                " of sequence " + std::to_string(b));
      const bool masked = s.loss_mask[j] != 0 && (o.fixed_mask.empty() ? uniform01(hash_counters(key, b, j)) < t
                                                                       : o.fixed_mask[b * L + j] != 0);
      m.tokens[b * L + j] = masked ? o.mask_token_id : s.tokens[j];
      if (!masked) continue;
      m.out_rows.push_back(b * L + (j > 0 ? j - 1 : 0));
      m.targets.push_back(s.tokens[j]);
      m.weights.push_back(static_cast<float>(1.0 / (t * z)));
    }
  }
  return m;
}

}  // namespace dc::train
