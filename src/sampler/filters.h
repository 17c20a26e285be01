// Per-row logits processing of Dream's `sample_tokens` (spec §3.5): temperature, top-p, top-k,
// softmax, then the sampled or greedy token and its confidence. One masked row of n_vocab f32 logits
// at a time. All math is f32 with f64 accumulation (the reference runs in bf16: deliberate difference).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "sampler/rng.h"
#include "ops/head_sampler.h"  // ConfidenceKind, FilterConfig, TokenSample, HeadSampling

namespace dc {

// Memory reused across rows by one thread (never shared between threads).
struct FilterScratch {
  std::vector<int32_t> order;  // token ids, a sorted prefix (larger logit first, ties lower id first)
  std::vector<float> values;   // a copy of the logits for top_k_filter
  std::vector<int32_t> ids;    // surviving token ids of the last filtered_distribution
  std::vector<float> probs;    // their probabilities (same order as ids), sum 1
  std::vector<float> row;      // sample_head_rows: a copy of a logits row that several entries share
};

// ---- The individual steps, in place on one row (used by tests and by callers that need dense rows).

// logits[i] /= temperature for temperature > 0; no-op for 0. logits: [n_vocab].
void apply_temperature(float* logits, int64_t n_vocab, float temperature);

// Dream's top_p_filter: sort descending (ties: lower id first), c = cumsum(softmax(sorted)); token i of
// the sorted order is removed iff i > 0 and c[i−1] > top_p, i.e. the token whose cumulative mass
// crosses top_p is kept and the top token always is. Removed logits become −inf (the reference writes
// finfo.min; both give probability exactly 0). No-op for top_p >= 1. Cumsum in f64, compared in f32.
void top_p_filter(float* logits, int64_t n_vocab, float top_p, FilterScratch& scratch);

// Dream's top_k_filter: k = min(top_k, n_vocab); logits strictly less than the k-th largest become −inf
// (ties at the threshold are all kept). No-op for top_k <= 0.
void top_k_filter(float* logits, int64_t n_vocab, int64_t top_k, FilterScratch& scratch);

// Numerically stable softmax over n entries, in place (−inf entries give 0). n >= 1, max finite.
void softmax_in_place(float* x, int64_t n);

// ---- The fused path used by generation.

// Applies temperature (in place on logits), then top-p and top-k (in that order), then softmax over the
// survivors only, which is exactly the reference's dense softmax over the filtered row since removed
// tokens get probability 0. Result in scratch.ids / scratch.probs (any order; ids distinct).
// Cost: O(n_vocab) passes plus a partial selection (a heap for small k, nth_element otherwise); the
// vocabulary is never fully sorted unless top-p needs it. logits: [n_vocab], overwritten.
// Errors: a NaN or +inf logit (before or after dividing by the temperature), or every logit −inf.
Status filtered_distribution(float* logits, int64_t n_vocab, const FilterConfig& config, FilterScratch& scratch);

// filtered_distribution, then the token: temperature > 0 → one categorical draw from `rng`; else the
// argmax (ties → lowest id). Then the confidence of `kind` over the filtered distribution.
// Thread safety: touches only its arguments.
Result<TokenSample> sample_token(float* logits, int64_t n_vocab, const FilterConfig& config, ConfidenceKind kind,
                                 Rng& rng, FilterScratch& scratch);

class ThreadPool;

// The CPU kernel of HeadSampler::sample (ops/head_sampler.h) for one block of logits: out[e] =
// sample_token of args.rows[e] for e in [begin, end), whose hidden rows lie in [first_row, first_row +
// n_logits_rows) and whose logits are logits[(hidden_row − first_row) · n_vocab ...] ([n_logits_rows,
// n_vocab], overwritten; a row shared by several entries is copied first so each entry sees it intact).
// Each entry draws from its own stream (seed, kToken, step, row, position): the results do not depend
// on the blocks or the pool (parallel over entries; nullptr = serial). Errors: sample_token's, naming the
// step, row and position of the first failing entry.
Status sample_head_rows(const HeadSampling& args, int64_t begin, int64_t end, float* logits, int64_t first_row,
                        int64_t n_vocab, ThreadPool* pool, std::span<TokenSample> out);

}  // namespace dc
