// Helpers shared by the kernel tests (tests/ops): seeded random values, a relative-tolerance comparison and a
// kPanels copy of a weight made the way Model::pack_weights makes it (packed_copy.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "packed_copy.h"

namespace dc::testing {

// n values drawn from N(0, scale²), the same for the same seed.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// max |got - want| <= rel_tol * max |want|, every got finite; prints the worst index, both values, the tolerance.
inline void expect_close(const std::vector<float>& want, const std::vector<float>& got, double rel_tol,
                         const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double max_ref = 1e-30, worst = 0;
  size_t worst_i = 0;
  for (float w : want) max_ref = std::max(max_ref, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " index " << i << " got " << got[i];
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (d > worst) worst = d, worst_i = i;
  }
  EXPECT_LE(worst, rel_tol * max_ref) << what << ": index " << worst_i << " got " << got[worst_i] << " want "
                                      << want[worst_i] << " tol " << rel_tol * max_ref;
}

}  // namespace dc::testing
