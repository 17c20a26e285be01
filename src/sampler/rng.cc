// xoshiro256** (Blackman & Vigna) with splitmix64 seeding; stream keys are chained splitmix64 mixes.
#include "sampler/rng.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/splitmix64.h"

namespace dc {
namespace {

// A one-shot 64-bit mix of (h, v): distinct inputs give well-spread, practically distinct outputs.
uint64_t mix(uint64_t h, uint64_t v) {
  return splitmix64(h ^ (v * 0xD1B54A32D192ED03ull));
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (auto& s : s_) s = splitmix64_next(state);
  if ((s_[0] | s_[1] | s_[2] | s_[3]) == 0) s_[0] = 1;  // unreachable in practice; xoshiro needs non-zero
}

Rng Rng::for_stream(uint64_t seed, RngPurpose purpose, int64_t step, int64_t row, int64_t position) {
  uint64_t h = mix(0x6A09E667F3BCC909ull, seed);
  h = mix(h, static_cast<uint64_t>(purpose));
  h = mix(h, static_cast<uint64_t>(step));
  h = mix(h, static_cast<uint64_t>(row));
  h = mix(h, static_cast<uint64_t>(position));
  return Rng(h);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform_float() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

double Rng::uniform_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

int64_t sample_categorical(std::span<const float> probs, Rng& rng) {
  DC_CHECK(!probs.empty(), "sample_categorical needs at least one category");
  double total = 0.0;
  int64_t last_positive = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0f) {
      total += probs[i];
      last_positive = static_cast<int64_t>(i);
    }
  }
  DC_CHECK(last_positive >= 0, "sample_categorical needs a positive probability");
  const double target = rng.uniform_double() * total;
  double acc = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    if (acc > target) return static_cast<int64_t>(i);
  }
  return last_positive;  // rounding left target at the very top: the last positive category
}

std::vector<int64_t> sample_without_replacement(std::span<const float> log_weights, int64_t k, Rng& rng) {
  const int64_t n = static_cast<int64_t>(log_weights.size());
  DC_CHECK(k >= 0 && k <= n, "sample_without_replacement needs 0 <= k <= n");
  struct Key {
    double key;
    int64_t index;
  };
  std::vector<Key> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // Gumbel(0, 1) = −log(−log(u)) with u strictly inside (0, 1): 52 bits plus a half step.
    const double u = (static_cast<double>(rng.next_u64() >> 12) + 0.5) * 0x1.0p-52;
    const double gumbel = -std::log(-std::log(u));
    const double lw = log_weights[static_cast<size_t>(i)];
    keys[static_cast<size_t>(i)] = {lw + gumbel, i};
  }
  auto before = [](const Key& a, const Key& b) {
    // NaN-free: lw is finite or −inf and gumbel is finite, so key is finite or −inf.
    return a.key > b.key || (a.key == b.key && a.index < b.index);
  };
  if (k < n) std::nth_element(keys.begin(), keys.begin() + k, keys.end(), before);
  std::sort(keys.begin(), keys.begin() + k, before);
  std::vector<int64_t> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(i)] = keys[static_cast<size_t>(i)].index;
  return out;
}

}  // namespace dc
