// matmul_nt front-end: checks the shapes once and dispatches to the backend kernel.
#include "ops/matmul.h"

#include "core/check.h"
#include "ops/cpu/kernels.h"

namespace dc {

void matmul_nt(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
  DC_CHECK(x != nullptr && y != nullptr && !w.empty(), "matmul_nt: null operand");
  DC_CHECK(n >= 0 && w.rows > 0 && w.cols > 0, "matmul_nt: bad sizes");
  switch (ctx.device) {
    case Device::kCpu:
      cpu::matmul_nt(ctx.pool, x, n, w, bias, y);
      return;
  }
}

}  // namespace dc
