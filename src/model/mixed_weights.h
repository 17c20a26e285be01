// MixedPrecisionWeights: what one optimizer step of bf16 mixed-precision training reads. Every matrix
// of the f32 master weights rounded to bf16 and laid out once for the fast bf16 GEMM (kPanels): W for the
// forward's x·Wᵀ, and the same words viewed as Wᵀ (kPanelsTransposed, no second copy) for the backward's
// dx = dy·W. Norm weights, biases and the embedding table (a lookup, not a GEMM) stay the master's f32.
// The copies are rewritten once per optimizer step: by the optimizer itself as it updates each matrix
// (adamw_update_panels, ops/adamw.h), or by refresh().
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/pages.h"
#include "core/status.h"
#include "model/weights.h"

namespace dc {

class MixedPrecisionWeights {
 public:
  // Makes the copies current for `master` (f32 matrices, as ModelParams::weights()), reusing the buffers
  // of the previous refresh (so a Model built once over forward() reads each step's copies): re-lays every
  // matrix, unless the optimizer wrote the panels from these master weights since the last refresh
  // (mark_written), in which case only the master's norm weights and biases are taken again. Needs
  // bf16_backward(ctx) (kBF16 precision, AVX512_BF16). Fails only when memory runs out.
  Status refresh(const Context& ctx, const ModelWeights& master);

  // The forward's weights: bf16 kPanels matrices, views of the master's f32 everything else.
  const ModelWeights& forward() const { return forward_; }
  // Wᵀ of every matrix [cols, rows]: kPanelsTransposed views of forward()'s copies (the other fields are
  // empty), for Model::backward.
  const ModelWeights& transposed() const { return transposed_; }

  // The W panel buffer of the matrix whose f32 master data is at `master` (after a refresh), for the
  // optimizer to write; null for a tensor that has none (norm weights, biases, the embedding table of a
  // model with an untied lm_head).
  uint32_t* panels_of(const float* master) const;
  // Writes the panels of the matrix whose f32 master data is at `master` (after a refresh) from `bf16`,
  // that matrix's values rounded to bf16, row-major [rows, cols] (e.g. as ZeRO's bf16 all-gather delivers
  // them). invalid_argument for a tensor that has no panels.
  Status write_matrix(const Context& ctx, const float* master, const uint16_t* bf16);
  // The optimizer has rewritten every matrix's panels from the updated master weights: the next
  // refresh() keeps them.
  void mark_written() { written_ = true; }

 private:
  struct Matrix {
    const float* master = nullptr;
    WeightView w;  // the packed view of W
  };
  ModelWeights forward_, transposed_;
  std::vector<Matrix> matrices_;                               // in the order refresh() visits them
  std::vector<PageArray<uint8_t>> bufs_;  // one per matrix, reused
  std::vector<uint16_t> tmp_;                                  // a row-major bf16 matrix before packing
  bool written_ = false;
};

}  // namespace dc
