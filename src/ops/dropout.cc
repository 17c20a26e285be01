// Hashed dropout's front-end (ops/dropout.h): the CPU kernel or the device's.
#include "ops/dropout.h"

#include <cmath>

#include "core/check.h"
#include "ops/cpu/kernels.h"
#include "ops/device.h"

namespace dc {

uint64_t dropout_threshold(float p) {
  if (!(p > 0.0f)) return 0;
  // p·2⁵³ is exact in a double (p has 24 significant bits), and so is its ceiling (below 2⁵³ for p < 1).
  return static_cast<uint64_t>(std::ceil(std::ldexp(static_cast<double>(p), 53))) << 11;
}

void dropout_hashed(const Context& ctx, const float* x, int64_t n, int64_t d, uint64_t seed, float p, float* y) {
  DC_CHECK(x != nullptr && y != nullptr && n >= 0 && d >= 0 && p > 0.0f && p < 1.0f, "dropout_hashed: bad arguments");
  if (n == 0 || d == 0) return;
  const uint64_t threshold = dropout_threshold(p);
  const float keep_scale = 1.0f / (1.0f - p);
  switch (ctx.device) {
    case Device::kCpu:
      return cpu::dropout(ctx.pool, x, n, d, seed, threshold, keep_scale, y);
    case Device::kVulkan:
      return ctx.backend->dropout(as_device(x), n, d, seed, threshold, keep_scale, as_device(y));
  }
}

}  // namespace dc
