// MixedPrecisionWeights: what one optimizer step of bf16 mixed-precision training reads. Every matrix
// of the f32 master weights rounded to bf16 once per step and laid out for the fast bf16 GEMM
// (kPanels): as W for the forward's x·Wᵀ, and as Wᵀ for the backward's dx = dy·W. Norm weights,
// biases and the embedding table (a lookup, not a GEMM) stay the master's f32.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "model/weights.h"

namespace dc {

class MixedPrecisionWeights {
 public:
  // Rebuilds both copies from `master` (f32 matrices, as ModelParams::weights()), reusing the buffers of
  // the previous refresh: after every refresh from the same master the views of forward() and
  // transposed() are the same, so a Model built once over forward() reads each step's copies. Needs bf16_backward(ctx) (kBF16 precision, AVX512_BF16). Fails only when
  // memory runs out.
  Status refresh(const Context& ctx, const ModelWeights& master);

  // The forward's weights: bf16 kPanels matrices, views of the master's f32 everything else.
  const ModelWeights& forward() const { return forward_; }
  // Wᵀ of every matrix [cols, rows] in bf16 kPanels (the other fields are empty), for Model::backward.
  const ModelWeights& transposed() const { return transposed_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  ModelWeights forward_, transposed_;
  std::vector<std::unique_ptr<uint8_t[], FreeDeleter>> bufs_;  // one per packed matrix, reused
  std::vector<uint16_t> tmp_;                                  // a row-major bf16 matrix before packing
};

}  // namespace dc
