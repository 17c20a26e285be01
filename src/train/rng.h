// Counter-based random numbers for training: every draw is a pure function of (seed, counters), so a
// resumed run draws exactly what the uninterrupted run drew, whatever happened before.
#pragma once

#include <cstdint>

#include "core/splitmix64.h"

namespace dc::train {

// A bijective 64-bit mix (splitmix64 of x).
inline uint64_t mix64(uint64_t x) { return splitmix64(x); }

// A 64-bit hash of up to four counters under `seed`.
inline uint64_t hash_counters(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return mix64(mix64(mix64(mix64(seed) ^ a) ^ b) ^ c);
}

// Uniform double in [0, 1) with 53 random bits.
inline double uniform01(uint64_t bits) { return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace dc::train
