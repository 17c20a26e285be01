// The score row shared by the reference attention kernels (attention.cc, attention_window.cc,
// attention_backward.cc), so a window, the full pass and the backward compute it identically.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace dc::cpu {

// scores[j] = scale · (qi · k_j) for every key j of the row with row_valid[j] (all when row_valid is null;
// the others are left untouched); k_j = k + j·kv_stride, D values. Returns the largest score (−inf when no
// key is valid).
inline float attention_scores(const float* qi, const float* k, int64_t L, int64_t kv_stride, int64_t D, float scale,
                              const uint8_t* row_valid, float* scores) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L; ++j) {
    if (row_valid && !row_valid[j]) continue;
    const float* kj = k + j * kv_stride;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t t = 0; t < D; ++t) dot += qi[t] * kj[t];
    scores[j] = dot * scale;
    max_score = std::max(max_score, scores[j]);
  }
  return max_score;
}

}  // namespace dc::cpu
