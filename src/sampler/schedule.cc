// Time grid and transfer counts, written to reproduce PyTorch's f32 rounding (no fused multiply-add).
#include "sampler/schedule.h"

#include "core/check.h"

namespace dc {
namespace {

// a·b rounded to f32 on its own: the volatile store keeps the compiler from fusing it into an FMA
// with the following add (GCC contracts by default for C++), which would change the last ulp.
float mul_rounded(float a, float b) {
  volatile float p = a * b;
  return p;
}

}  // namespace

std::vector<float> timesteps(int steps, float eps) {
  DC_CHECK(steps >= 1, "timesteps needs steps >= 1");
  const int64_t n = static_cast<int64_t>(steps) + 1;
  const float start = 1.0f;
  const float end = eps;
  const float step = (end - start) / static_cast<float>(n - 1);
  const int64_t halfway = n / 2;
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = i < halfway ? start + mul_rounded(step, static_cast<float>(i))
                                              : end - mul_rounded(step, static_cast<float>(n - 1 - i));
  }
  return out;
}

float origin_transfer_probability(float t, float s, bool last_step) {
  if (last_step) return 1.0f;
  const float ratio = s / t;
  return 1.0f - ratio;
}

int64_t transfer_count(float avg_masked, float t, float s, bool last_step) {
  if (last_step) return static_cast<int64_t>(avg_masked);
  const float ratio = s / t;
  const float frac = 1.0f - ratio;
  return static_cast<int64_t>(mul_rounded(avg_masked, frac));
}

}  // namespace dc
