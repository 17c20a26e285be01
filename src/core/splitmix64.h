// splitmix64 (Steele, Lea and Flood; Stafford's "Mix13" constants): the one 64-bit mixer of the project,
// behind RNG seeding and stream keys (sampler/rng.cc), counter hashes (train/rng.h), synthetic weights
// and hash tables.
#pragma once

#include <cstdint>

namespace dc {

// The bijective output mix of splitmix64 (no increment): well spread bits for any input.
inline uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64 of the state x: the finaliser of x + the golden-ratio increment (a bijective 64-bit hash).
inline uint64_t splitmix64(uint64_t x) { return splitmix64_finalize(x + 0x9E3779B97F4A7C15ull); }

// The generator: advances `state` by the increment and returns the mix of the new state.
inline uint64_t splitmix64_next(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  return splitmix64_finalize(state);
}

}  // namespace dc
