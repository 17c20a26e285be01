// The masked-diffusion training objective of Dream / DiffuCoder (spec §2.6, §4.5): noise a batch of
// sequences by masking completion tokens with probability t, and the weighted cross-entropy terms
// that the fused loss op (ops/loss.h) evaluates on the rows that carry a loss.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace dc::train {

// One training sequence on its canvas: tokens and which positions may be masked and scored (1 =
// completion, including the <|dlm_pad|> fill of an SFT canvas; 0 = prompt, never masked).
struct TrainSequence {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
};

// How the summed per-token losses are normalised (see make_masked_batch).
enum class LossNorm {
  kTokens,     // ÷ Σ_b N_b: the number of maskable tokens of the batch (default)
  kSequences,  // per sequence ÷ N_b, then mean over the batch (LLaDA SFT: ÷ answer length, ÷ batch size)
};

struct MaskingOptions {
  double eps = 1e-3;          // t ~ U(eps, 1): t = eps + (1 − eps)·u
  int32_t mask_token_id = 0;  // <|mask|>
  LossNorm norm = LossNorm::kTokens;
  // Fixed t per sequence (tests, reproducing a reference batch); empty: drawn from the key.
  std::vector<double> fixed_t;
  // Fixed masked positions [B·L] (tests); empty: drawn. A 1 at a position with loss_mask 0 is an error.
  std::vector<uint8_t> fixed_mask;
};

// A noised batch ready for Model::forward in training mode plus ops/loss.h.
struct MaskedBatch {
  int64_t n_batch = 0, n_seq = 0;
  std::vector<int32_t> tokens;    // [B, L] x_t: masked positions hold mask_token_id
  std::vector<int64_t> out_rows;  // [n_out] flat row b·L + (j − 1) whose logits predict masked position j
  std::vector<int32_t> targets;   // [n_out] the clean token x_0[b, j]
  std::vector<float> weights;     // [n_out] 1 / (t_b · Z), Z from LossNorm
  std::vector<double> t;          // [B] the mask ratio of each sequence
  int64_t n_maskable = 0;         // Σ_b N_b
  // Optional, for left-padded batches (ForwardBatch::valid / positions); empty: all valid, 0..L-1.
  std::vector<uint8_t> valid;     // [B, L]
  std::vector<int32_t> positions; // [B, L]
};

// Masked-diffusion loss (Dream / DiffuCoder SFT and pre-training; the ELBO weight 1/t of the linear
// schedule, Dream arXiv 2508.15487 §2, LLaDA arXiv 2502.09992 eq. 3 and its GUIDELINES.md SFT code):
//   per sequence b: t_b ~ U(eps, 1); each maskable position j (loss_mask = 1, N_b of them) is masked
//   independently with probability t_b (u_bj < t_b), giving the set M_b; prompt positions never.
//   loss = Σ_b Σ_{j ∈ M_b} CE(logits[b, j−1], x_0[b, j]) / t_b / Z
//   Z = Σ_b N_b (LossNorm::kTokens) or Z = B·N_b for sequence b (LossNorm::kSequences).
// Logits shift (spec §2.6): position j is predicted by the model output at j − 1 (position 0 by its
// own output, as the reference's concat shift does). Draws come from hash_counters(key, b, j): the same
// key gives the same batch. All sequences must have the same length L ≥ 1 (the canvas); a token
// outside [0, n_vocab) or a bad loss_mask size gives invalid_argument naming the sequence.
Result<MaskedBatch> make_masked_batch(const std::vector<TrainSequence>& sequences, const MaskingOptions& options,
                                      uint64_t key, int64_t n_vocab);

}  // namespace dc::train
