// MixedPrecisionWeights::refresh: round and pack — or keep what the optimizer wrote.
#include "model/mixed_weights.h"

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/matmul.h"

namespace dc {

Status MixedPrecisionWeights::refresh(const Context& ctx, const ModelWeights& master) {
  if (!bf16_backward(ctx)) return invalid_argument("mixed precision needs matmul precision bf16 on a CPU with AVX512_BF16");
  const bool repack = !written_ || matrices_.empty();
  written_ = false;
  forward_ = master;
  transposed_ = ModelWeights{};
  transposed_.layers.resize(master.layers.size());
  if (repack) matrices_.clear();
  size_t next = 0;
  // Packs the bf16 row-major [rows, cols] matrix in tmp_ into buffer `next`, returning its view.
  auto pack = [&](int64_t rows, int64_t cols) -> Result<WeightView> {
    const WeightView rm{DType::kBF16, tmp_.data(), rows, cols};
    const PanelSizes sizes = panel_sizes(rm);
    if (next == bufs_.size()) {
      bufs_.push_back(alloc_page_array<uint8_t>(static_cast<size_t>(sizes.data_bytes)));
      if (!bufs_.back()) return out_of_range("mixed precision: out of memory for a bf16 copy of a matrix");
    }
    return pack_panels(ctx, rm, bufs_[next++].get(), nullptr, nullptr, 0, sizes.panels);
  };
  auto both = [&](const WeightView& w, WeightView& fwd, WeightView& tr) -> Status {
    if (!repack) {  // the optimizer wrote the panels (the same matrices, in the same order)
      fwd = matrices_[next++].w;
    } else {
      const int64_t n = w.rows * w.cols;
      if (static_cast<int64_t>(tmp_.size()) < n) tmp_.resize(static_cast<size_t>(n));
      uint16_t* t = tmp_.data();
      const float* src = static_cast<const float*>(w.data);
      parallel_for(ctx.pool, n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) t[i] = f32_to_bf16(src[i]);
      }, 1 << 16);
      DC_ASSIGN_OR_RETURN(fwd, pack(w.rows, w.cols));
      matrices_.push_back(Matrix{src, fwd});
    }
    tr = transposed_panels(fwd);
    return Status();
  };
  for (size_t il = 0; il < master.layers.size(); ++il) {
    const LayerWeights& m = master.layers[il];
    LayerWeights& f = forward_.layers[il];
    LayerWeights& t = transposed_.layers[il];
    DC_RETURN_IF_ERROR(both(m.wq, f.wq, t.wq));
    DC_RETURN_IF_ERROR(both(m.wk, f.wk, t.wk));
    DC_RETURN_IF_ERROR(both(m.wv, f.wv, t.wv));
    DC_RETURN_IF_ERROR(both(m.wo, f.wo, t.wo));
    DC_RETURN_IF_ERROR(both(m.w_gate, f.w_gate, t.w_gate));
    DC_RETURN_IF_ERROR(both(m.w_up, f.w_up, t.w_up));
    DC_RETURN_IF_ERROR(both(m.w_down, f.w_down, t.w_down));
  }
  return both(master.output, forward_.output, transposed_.output);  // tied: the embedding as lm_head
}

Status MixedPrecisionWeights::write_matrix(const Context& ctx, const float* master, const uint16_t* bf16) {
  for (const Matrix& m : matrices_) {
    if (m.master != master) continue;
    const WeightView rm{DType::kBF16, bf16, m.w.rows, m.w.cols};
    pack_panels(ctx, rm, const_cast<void*>(m.w.data), nullptr, nullptr, 0, panel_sizes(rm).panels);
    return Status();
  }
  return invalid_argument("mixed precision: no bf16 copy of this tensor to write");
}

uint32_t* MixedPrecisionWeights::panels_of(const float* master) const {
  for (const Matrix& m : matrices_)
    if (m.master == master) return static_cast<uint32_t*>(const_cast<void*>(m.w.data));
  return nullptr;
}

}  // namespace dc
