// Helpers shared by the kernel tests (tests/ops): seeded random values, a relative-tolerance comparison and a
// kPanels copy of a weight made the way Model::pack_weights makes it.
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

// The kPanels copy of a weight (bf16 or quantized), packed in two chunks of panels as Model::pack_weights
// packs in chunks; the buffers start poisoned (0xa5 bytes), so unwritten bytes show.
struct PackedCopy {
  using Buffer = std::unique_ptr<uint8_t[], decltype(&std::free)>;
  Buffer data{nullptr, &std::free}, scales{nullptr, &std::free}, mins{nullptr, &std::free};
  WeightView view;

  PackedCopy(ThreadPool* pool, const WeightView& w) {
    const PanelSizes sizes = panel_sizes(w);
    auto buffer = [](int64_t bytes) {
      Buffer b(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)), &std::free);
      std::fill_n(b.get(), bytes, uint8_t{0xa5});
      return b;
    };
    data = buffer(sizes.data_bytes), scales = buffer(sizes.table_bytes), mins = buffer(sizes.table_bytes);
    Context ctx{Device::kCpu, pool};
    pack_panels(ctx, w, data.get(), scales.get(), mins.get(), 0, sizes.panels / 2);
    view = pack_panels(ctx, w, data.get(), scales.get(), mins.get(), sizes.panels / 2, sizes.panels);
  }
  const uint32_t* words() const { return reinterpret_cast<const uint32_t*>(data.get()); }
};

}  // namespace dc::testing
