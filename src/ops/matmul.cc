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

}  // namespace dc
