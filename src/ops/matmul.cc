// matmul_nt front-end: checks the shapes once and dispatches on device and weight dtype; the context
// picks the reference kernel or the fast one (and the fast one's activation precision).
#include "ops/matmul.h"

#include "core/check.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant.h"

namespace dc {

void matmul_nt(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
  DC_CHECK(x != nullptr && y != nullptr && !w.empty(), "matmul_nt: null operand");
  DC_CHECK(n >= 0 && w.rows > 0 && w.cols > 0, "matmul_nt: bad sizes");
  DC_CHECK(w.layout == WeightLayout::kRowMajor || w.dtype == DType::kBF16, "matmul_nt: kPanels needs bf16");
  switch (ctx.device) {
    case Device::kCpu:
      switch (w.dtype) {
        case DType::kF32:
        case DType::kF16:
        case DType::kBF16:
          if (ctx.reference_kernels) return cpu::matmul_nt(ctx.pool, x, n, w, bias, y);
          return cpu::matmul_nt_fast(ctx.pool, x, n, w, bias, y, ctx.matmul_precision);
        case DType::kI8:
        case DType::kU8:
          // Quantized weights (WeightQuant): ops/cpu/matmul_quant.cc.
          DC_CHECK(w.quantized() && w.scales != nullptr, "matmul_nt: integer weight without its quantization");
          DC_CHECK(w.quant != WeightQuant::kQ4 || (w.mins != nullptr && w.group_size > 0 && w.group_size % 2 == 0 &&
                                                   w.cols % w.group_size == 0),
                   "matmul_nt: q4 weight without mins or with a bad group size");
          return cpu::matmul_nt_quant(ctx.pool, x, n, w, bias, y,
                                      ctx.reference_kernels ? cpu::QuantKernel::kReference : cpu::QuantKernel::kAuto);
      }
      DC_CHECK(false, "matmul_nt: no kernel for this weight dtype");
  }
}

int64_t panel_words(int64_t rows, int64_t cols) {
  return (rows + kPanelRows - 1) / kPanelRows * ((cols + 1) / 2) * kPanelRows;
}

WeightView pack_panels(const Context& ctx, const WeightView& w, uint32_t* out, int64_t panel_begin,
                       int64_t panel_end) {
  DC_CHECK(w.dtype == DType::kBF16 && !w.quantized() && w.layout == WeightLayout::kRowMajor && !w.empty(),
           "pack_panels: needs a row-major bf16 weight");
  DC_CHECK(out != nullptr && reinterpret_cast<uintptr_t>(out) % 64 == 0, "pack_panels: out must be 64-byte aligned");
  DC_CHECK(0 <= panel_begin && panel_begin <= panel_end && panel_end <= (w.rows + kPanelRows - 1) / kPanelRows,
           "pack_panels: panel range outside the weight");
  switch (ctx.device) {
    case Device::kCpu: cpu::pack_panels_bf16(ctx.pool, w, panel_begin, panel_end, out); break;
  }
  WeightView packed = w;
  packed.data = out;
  packed.layout = WeightLayout::kPanels;
  return packed;
}

}  // namespace dc
