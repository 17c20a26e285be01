// A small seedable RNG (xoshiro256** seeded through splitmix64) with counter-style stream derivation,
// so every random draw of generation is a pure function of (seed, step, row, position, purpose) and
// results never depend on thread scheduling. Plus categorical and without-replacement sampling.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dc {

// What a stream is used for; part of the stream key so that different uses never share draws.
enum class RngPurpose : uint64_t {
  kToken = 1,     // sampling a token from a masked position's distribution
  kTransfer = 2,  // origin algorithm: the u ~ U[0,1) that decides whether a position unmasks
  kSelect = 3,    // alg_temp > 0: drawing the positions to unmask in a row
  kTest = 99,     // free for tests
};

class Rng {
 public:
  // Expands `seed` with splitmix64 into the 256-bit state (never all zero).
  explicit Rng(uint64_t seed);

  // An independent stream for one draw site: hashes (seed, purpose, step, row, position).
  // position may be -1 for per-row draws, step -1 for draws before the first step.
  static Rng for_stream(uint64_t seed, RngPurpose purpose, int64_t step, int64_t row, int64_t position);

  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits (the granularity of an f32 in [0.5, 1), like torch.rand).
  float uniform_float();
  // Uniform in [0, 1) with 53 random bits.
  double uniform_double();

 private:
  uint64_t s_[4];
};

// Index i with probability probs[i] / Σ probs (probs >= 0, Σ > 0; not required to sum to 1).
// Never returns an index whose probability is 0. Uses one uniform_double draw.
// probs: [n]. Precondition: n >= 1 and at least one probability > 0.
int64_t sample_categorical(std::span<const float> probs, Rng& rng);

// Draws k distinct indices without replacement, successive draws proportional to w_i = exp(log_weights[i])
// among the indices not yet drawn (i.e. torch.multinomial(softmax(log_weights), k, replacement=False)).
// Implemented exactly in distribution with Gumbel-top-k (one uniform per index, O(n) selection):
// key_i = log_weights[i] + Gumbel_i; the k largest keys, returned in draw order (largest key first),
// ties broken by the lowest index. Indices with log weight −inf are drawn only after all finite
// ones (in index order). log_weights: [n]; requires 0 <= k <= n.
std::vector<int64_t> sample_without_replacement(std::span<const float> log_weights, int64_t k, Rng& rng);

}  // namespace dc
