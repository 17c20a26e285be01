// Hashed dropout: a mask that is a function of (seed, row, column) alone, so that a backward draws its forward's
// mask again without storing it, and a device draws the CPU's bit for bit (LoRA's adapters' dropout,
// model/lora_project.h).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/splitmix64.h"

namespace dc {

// The mask's threshold for the drop probability p (p <= 0: 0, everything kept): ⌈p·2⁵³⌉·2¹¹.
uint64_t dropout_threshold(float p);

// Whether the mask keeps value (row, col): h = splitmix64(splitmix64(seed ^ row) ^ col) >= threshold, the same as
// (h >> 11)·2⁻⁵³ >= p (kept with probability 1 − p).
inline bool dropout_keeps(uint64_t seed, int64_t row, int64_t col, uint64_t threshold) {
  return splitmix64(splitmix64(seed ^ static_cast<uint64_t>(row)) ^ static_cast<uint64_t>(col)) >= threshold;
}

// y[n, d] = x · (1/(1 − p)) where dropout_keeps(seed, i, c, dropout_threshold(p)), else 0 (the scale a float
// computed on the host, one multiply per value: the same bits on every device). 0 < p < 1; y may be x. On a
// device (Context::device kVulkan) x and y are its memory (n·d at most 2^31).
void dropout_hashed(const Context& ctx, const float* x, int64_t n, int64_t d, uint64_t seed, float p, float* y);

}  // namespace dc
