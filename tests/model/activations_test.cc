// Activations (model/activations.h): bytes_for, which a device run's memory plan counts before the first forward,
// is what resize() then holds, with and without recompute, after a larger and a smaller batch.
#include <gtest/gtest.h>

#include "model/activations.h"

namespace dc {
namespace {

TEST(Activations, BytesForIsWhatResizeHolds) {
  Context cpu;
  const int64_t n_layer = 3, E = 24, q_dim = 32, kv_dim = 16, F = 40;
  for (const bool recompute : {false, true}) {
    Activations a;
    a.recompute = recompute;
    for (const auto [T, n_out] : {std::pair<int64_t, int64_t>{70, 9}, {12, 12}, {5, 0}}) {
      ASSERT_TRUE(a.resize(cpu, n_layer, T, E, q_dim, kv_dim, F, n_out).ok());
      EXPECT_EQ(a.bytes(), Activations::bytes_for(recompute, n_layer, T, E, q_dim, kv_dim, F, n_out))
          << "recompute " << recompute << ", T " << T << ", n_out " << n_out;
    }
  }
  // Checkpointing keeps each layer's input and one layer: n_layer·T·E + one layer's fields instead of n_layer layers'.
  const int64_t T = 10, layer = T * (4 * E + 2 * q_dim + 2 * kv_dim + 3 * F);
  EXPECT_EQ(Activations::bytes_for(false, n_layer, T, E, q_dim, kv_dim, F, 0), 4 * n_layer * layer);
  EXPECT_EQ(Activations::bytes_for(true, n_layer, T, E, q_dim, kv_dim, F, 0), 4 * (n_layer * T * E + layer));
}

}  // namespace
}  // namespace dc
