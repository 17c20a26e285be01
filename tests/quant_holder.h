// A random q8 / q4 weight with the dense values its codes stand for, and a random activation matrix: shared
// by the quantized-kernel tests (tests/ops/quant_test.cc) and their speed benchmark (bench/kernels/
// quant_bench.cc), so both time and check the same data. No GoogleTest here.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/weight.h"

namespace dc::testing {

// A random quantized weight [rows, cols]: codes over the whole range, positive scales, q4 mins of either sign
// (q4: `group` columns per scale). The view points into the holder, which therefore is not copied or moved.
struct QuantHolder {
  std::vector<uint8_t> codes;
  std::vector<float> scales32;
  std::vector<uint16_t> scales16, mins16;
  WeightView view;
  std::vector<float> dense;  // [rows, cols] the values the codes stand for

  QuantHolder(WeightQuant quant, int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(0.002f, 0.02f), mn(-0.15f, 0.05f);
    view.rows = rows;
    view.cols = cols;
    view.quant = quant;
    if (quant == WeightQuant::kQ8) {
      codes.resize(rows * cols);
      for (auto& c : codes) c = static_cast<uint8_t>(static_cast<int8_t>(byte(gen) % 255 - 127));
      scales32.resize(rows);
      for (auto& s : scales32) s = scale(gen);
      view.dtype = DType::kI8;
      view.scales = scales32.data();
    } else {
      codes.resize(rows * cols / 2);
      for (auto& c : codes) c = static_cast<uint8_t>(byte(gen));
      scales16.resize(rows * cols / group);
      mins16.resize(rows * cols / group);
      for (auto& s : scales16) s = f32_to_f16(scale(gen));
      for (auto& m : mins16) m = f32_to_f16(mn(gen));
      view.dtype = DType::kU8;
      view.scales = scales16.data();
      view.mins = mins16.data();
      view.group_size = group;
    }
    view.data = codes.data();
    dense.resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        if (quant == WeightQuant::kQ8) {
          dense[r * cols + c] = scales32[r] * static_cast<float>(static_cast<int8_t>(codes[r * cols + c]));
        } else {
          const uint8_t b = codes[(r * cols + c) / 2];
          const int q = c % 2 == 0 ? (b & 15) : (b >> 4);
          const int64_t g = r * (cols / group) + c / group;
          dense[r * cols + c] = f16_to_f32(scales16[g]) * static_cast<float>(q) + f16_to_f32(mins16[g]);
        }
      }
  }
  QuantHolder(const QuantHolder&) = delete;
  QuantHolder& operator=(const QuantHolder&) = delete;
};

// x [n, k] from N(0, 1) with one outlier (25 at a third of the way), as real activations have.
inline std::vector<float> random_x(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n * k);
  for (auto& x : v) x = dist(gen);
  if (!v.empty()) v[v.size() / 3] = 25.0f;  // an outlier, as real activations have
  return v;
}

}  // namespace dc::testing
