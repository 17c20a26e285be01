// A masked-diffusion batch of make_grad_fixtures.py's grad_cases.json as the model reads it: the noised tokens,
// the loss rows (shifted by one), targets and 1/(t·Z) weights, written out from the case's mask and t
// independently of src/train (tests/model/grad_parity_test.cc, tests/lora/trainable_test.cc).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "batch_case.h"

namespace dc {

// tokens: the noised tokens; rows: the loss rows, one a target.
struct GradCase : BatchCase {
  std::vector<int32_t> targets;
  std::vector<float> weights;
  // The forward of the case (with unmerged adapters `lora`, or none).
  ForwardBatch batch(const LoraWeights* lora = nullptr) const {
    ForwardBatch b = view();
    b.lora = lora;
    return b;
  }
};

// The loss terms written out from the fixture's mask and t (independently of src/train).
inline GradCase make_grad_case(const nlohmann::json& c, int32_t mask_id) {
  GradCase k;
  k.B = c["n_batch"], k.L = c["n_seq"];
  const int64_t B = k.B, L = k.L;
  const auto tokens = c["tokens"].get<std::vector<int32_t>>();
  const auto loss_mask = c["loss_mask"].get<std::vector<int>>();
  const auto mask = c["mask"].get<std::vector<int>>();
  const auto t = c["t"].get<std::vector<double>>();
  if (!c["valid"].is_null()) {
    for (int v : c["valid"].get<std::vector<int>>()) k.valid.push_back(static_cast<uint8_t>(v));
    k.positions = c["positions"].get<std::vector<int32_t>>();
  }
  double total = 0;
  std::vector<double> n_b(B, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < L; ++j) n_b[b] += loss_mask[b * L + j], total += loss_mask[b * L + j];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < L; ++j) {
      const bool m = mask[b * L + j] != 0;
      k.tokens.push_back(m ? mask_id : tokens[b * L + j]);
      if (!m) continue;
      k.rows.push_back(b * L + (j > 0 ? j - 1 : 0));
      k.targets.push_back(tokens[b * L + j]);
      const double z = c["norm"] == "tokens" ? total : B * n_b[b];
      k.weights.push_back(static_cast<float>(1.0 / (t[b] * z)));
    }
  return k;
}

// ‖got − want‖ / ‖want‖ over n values (a gradient against its reference).
inline double grad_rel_diff(const float* got, const float* want, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) d += (got[i] - want[i]) * double(got[i] - want[i]), r += double(want[i]) * want[i];
  return std::sqrt(d) / std::max(std::sqrt(r), 1e-30);
}

}  // namespace dc
