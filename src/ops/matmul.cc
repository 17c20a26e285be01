// matmul_nt front-end: checks the shapes once and dispatches on device and weight dtype; the context
// picks the reference kernel or the fast one (and the fast one's activation precision).
#include "ops/matmul.h"

#include <string>

#include "core/check.h"
#include "core/profiler.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace dc {

void matmul_nt(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* bias, float* y) {
  const ProfileScope profile(ctx, [&] { return "GEMM x·Wᵀ, W " + std::to_string(w.rows) + "×" + std::to_string(w.cols); });
  DC_CHECK(x != nullptr && y != nullptr && !w.empty(), "matmul_nt: null operand");
  DC_CHECK(n >= 0 && w.rows > 0 && w.cols > 0, "matmul_nt: bad sizes");
  DC_CHECK(w.layout == WeightLayout::kRowMajor || w.dtype == DType::kBF16 || w.quantized(),
           "matmul_nt: kPanels needs a bf16 or quantized weight");
  Workspace own_workspace;  // the kernels' block buffers: ctx's, or (without one) this call's
  Workspace& ws = ctx.workspace != nullptr ? *ctx.workspace : own_workspace;
  switch (ctx.device) {
    case Device::kCpu:
      switch (w.dtype) {
        case DType::kF32:
        case DType::kF16:
        case DType::kBF16:
          if (ctx.reference_kernels) return cpu::matmul_nt(ctx.pool, x, n, w, bias, y);
          return cpu::matmul_nt_fast(ctx.pool, ws, x, n, w, bias, y, ctx.matmul_precision);
        case DType::kI8:
        case DType::kU8:
          // Quantized weights (WeightQuant): ops/cpu/matmul_quant.cc.
          DC_CHECK(w.quantized() && (w.scales != nullptr || w.quant == WeightQuant::kGguf),
                   "matmul_nt: integer weight without its quantization");
          DC_CHECK(w.quant != WeightQuant::kGguf || (w.ggml_type != cpu::GgmlType::kNone && w.layout == WeightLayout::kRowMajor &&
                                                     w.cols % cpu::ggml_block_info(w.ggml_type).values == 0),
                   "matmul_nt: ggml block weight without its type, or not row-major");
          DC_CHECK(w.quant != WeightQuant::kQ4 || (w.mins != nullptr && w.group_size > 0 && w.group_size % 2 == 0 &&
                                                   w.cols % w.group_size == 0),
                   "matmul_nt: q4 weight without mins or with a bad group size");
          return cpu::matmul_nt_quant(ctx.pool, ws, x, n, w, bias, y,
                                      ctx.reference_kernels ? cpu::QuantKernel::kReference : cpu::QuantKernel::kAuto);
      }
      DC_CHECK(false, "matmul_nt: no kernel for this weight dtype");
      return;
    case Device::kVulkan:
      return ctx.backend->matmul_nt(as_device(x), n, w, bias, as_device(y));
  }
}

void matmul_nt_residual(const Context& ctx, const float* x, int64_t n, const WeightView& w, float* h, float* tmp) {
  switch (ctx.device) {
    case Device::kCpu:
      matmul_nt(ctx, x, n, w, nullptr, tmp);
      return add_inplace(ctx, h, tmp, n * w.rows);
    case Device::kVulkan: {
      const ProfileScope profile(ctx, "GEMM x·Wᵀ + residual");
      DC_CHECK(x != nullptr && h != nullptr && !w.empty() && n >= 0, "matmul_nt_residual: bad operands");
      return ctx.backend->matmul_nt_residual(as_device(x), n, w, as_device(h));
    }
  }
}

void matmul_nt_swiglu(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* gate, float* out,
                      float* tmp) {
  switch (ctx.device) {
    case Device::kCpu:
      matmul_nt(ctx, x, n, w, nullptr, tmp);
      return swiglu(ctx, gate, tmp, n * w.rows, out);
    case Device::kVulkan: {
      const ProfileScope profile(ctx, "GEMM x·Wᵀ, SwiGLU");
      DC_CHECK(x != nullptr && gate != nullptr && out != nullptr && !w.empty() && n >= 0, "matmul_nt_swiglu: bad operands");
      return ctx.backend->matmul_nt_swiglu(as_device(x), n, w, as_device(gate), as_device(out));
    }
  }
}

void matmul_nt_add(const Context& ctx, const float* x, int64_t n, const WeightView& w, float* y) {
  DC_CHECK(x != nullptr && y != nullptr && !w.empty() && !w.quantized(), "matmul_nt_add: bad operand");
  DC_CHECK(n >= 0 && w.rows > 0 && w.cols > 0, "matmul_nt_add: bad sizes");
  DC_CHECK(w.layout == WeightLayout::kRowMajor || w.dtype == DType::kBF16, "matmul_nt_add: kPanels needs a bf16 weight");
  Workspace own_workspace;  // the kernels' block buffers: ctx's, or (without one) this call's
  Workspace& ws = ctx.workspace != nullptr ? *ctx.workspace : own_workspace;
  switch (ctx.device) {
    case Device::kCpu:
      if (ctx.reference_kernels) return cpu::matmul_nt(ctx.pool, x, n, w, nullptr, y, /*accumulate=*/true);
      return cpu::matmul_nt_fast(ctx.pool, ws, x, n, w, nullptr, y, ctx.matmul_precision, /*accumulate=*/true);
    case Device::kVulkan:
      DC_CHECK(false, "matmul_nt_add: the backward runs on the CPU only");
  }
}

namespace {

void matmul_tn_dispatch(const Context& ctx, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y,
                        bool accumulate) {
  DC_CHECK((n == 0 || (a != nullptr && b != nullptr)) && y != nullptr && n >= 0 && m >= 0 && k >= 0,
           "matmul_tn: bad arguments");
  switch (ctx.device) {
    case Device::kVulkan:
      DC_CHECK(false, "matmul_tn_add: the backward runs on the CPU only");
      return;
    case Device::kCpu:
      if (!bf16_backward(ctx)) return cpu::matmul_tn(ctx.pool, a, n, m, b, k, y, accumulate);
      Workspace own_workspace;  // the kernel's packing buffers: ctx's, or (without one) this call's
      return cpu::matmul_tn_fast(ctx.pool, ctx.workspace != nullptr ? *ctx.workspace : own_workspace, a, n, m, b, k,
                                 y, accumulate);
  }
}

}  // namespace

void matmul_tn_add(const Context& ctx, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y) {
  matmul_tn_dispatch(ctx, a, n, m, b, k, y, /*accumulate=*/true);
}

void matmul_tn(const Context& ctx, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y) {
  matmul_tn_dispatch(ctx, a, n, m, b, k, y, /*accumulate=*/false);
}

PanelSizes panel_sizes(const WeightView& w) {
  PanelSizes p;
  if (w.layout != WeightLayout::kRowMajor || w.empty()) return p;
  if (!w.quantized()) {
    if (w.dtype != DType::kBF16) return p;
    p.panel_rows = kPanelRows;
    p.panels = (w.rows + kPanelRows - 1) / kPanelRows;
    p.data_bytes = p.panels * (w.cols + 1) / 2 * kPanelRows * 4;
    return p;
  }
  const bool q4 = w.quant == WeightQuant::kQ4;
  if ((q4 && w.group_size % kQuantBlock != 0) || w.quant == WeightQuant::kGguf) return p;  // kGguf: read in place
  p.panel_rows = kQuantPanelRows;
  p.panels = (w.rows + kQuantPanelRows - 1) / kQuantPanelRows;
  p.data_bytes = p.panels * (w.cols + kQuantBlock - 1) / kQuantBlock * (q4 ? 512 : 1024);
  p.table_bytes = q4 ? p.panels * (w.cols / w.group_size) * kQuantPanelRows * 2 : 0;
  return p;
}

bool worth_packing(const Context& ctx, const WeightView& w) {
  if (ctx.device != Device::kCpu || ctx.reference_kernels || panel_sizes(w).panels == 0) return false;
  if (w.quantized()) return cpu::cpu_has_avx512_vnni();
  return ctx.matmul_precision == MatmulPrecision::kBF16 && cpu::cpu_has_avx512_bf16();
}

WeightView pack_panels(const Context& ctx, const WeightView& w, void* data, void* scales, void* mins,
                       int64_t panel_begin, int64_t panel_end) {
  const PanelSizes sizes = panel_sizes(w);
  DC_CHECK(sizes.panels > 0, "pack_panels: the weight has no kPanels layout");
  DC_CHECK(data != nullptr && reinterpret_cast<uintptr_t>(data) % 64 == 0, "pack_panels: data must be 64-byte aligned");
  DC_CHECK(sizes.table_bytes == 0 || (scales != nullptr && mins != nullptr), "pack_panels: q4 needs both tables");
  DC_CHECK(!w.quantized() || cpu::cpu_has_avx512_vnni(), "pack_panels: quantized weights need AVX-512 VNNI");
  DC_CHECK(0 <= panel_begin && panel_begin <= panel_end && panel_end <= sizes.panels,
           "pack_panels: panel range outside the weight");
  switch (ctx.device) {
    case Device::kCpu:
      if (!w.quantized()) {
        cpu::pack_panels_bf16(ctx.pool, w, panel_begin, panel_end, static_cast<uint32_t*>(data));
        break;
      }
      cpu::pack_quant_panels(ctx.pool, w, panel_begin, panel_end, static_cast<uint8_t*>(data),
                             static_cast<uint16_t*>(scales), static_cast<uint16_t*>(mins));
      break;
    case Device::kVulkan:
      DC_CHECK(false, "pack_panels: kPanels is the CPU's layout");
  }
  return panel_view(w, data, scales, mins);
}

WeightView transposed_panels(const WeightView& w) {
  DC_CHECK(w.dtype == DType::kBF16 && w.layout == WeightLayout::kPanels && !w.quantized(),
           "transposed_panels: needs a bf16 kPanels weight");
  WeightView t{DType::kBF16, w.data, w.cols, w.rows};
  t.layout = WeightLayout::kPanelsTransposed;
  return t;
}

WeightView panel_view(const WeightView& w, const void* data, const void* scales, const void* mins) {
  WeightView packed = w;
  packed.data = data;
  packed.layout = WeightLayout::kPanels;
  if (w.quant == WeightQuant::kQ4) packed.scales = scales, packed.mins = mins;
  return packed;
}

}  // namespace dc
