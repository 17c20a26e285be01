// Matrix products against stored weights. Hugging Face linear weights are [out, in], so the
// product is y = x · Wᵀ ("nt": x not transposed, W transposed).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "ops/weight.h"

namespace dc {

// y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias[w.rows] when bias != nullptr). Overwrites y.
// f32 accumulation over f32 / f16 / bf16 weights, threaded on ctx.pool; the result does not depend on
// the thread count. ctx.reference_kernels: the plain reference kernel. Otherwise the fast kernel, whose
// ctx.matmul_precision kBF16 rounds x to bf16 for bf16 weights (core/context.h). Quantized (q8 / q4)
// weights take ops/cpu/quant.h: with AVX-512 VNNI, x is rounded to int8 per 32-column block.
void matmul_nt(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* bias, float* y);

// The forward's products whose element-wise pass a device folds into the product's store (issue 35: no pass
// that only moves bytes): h[n, w.rows] += x[n, w.cols] · wᵀ (the residual add after the o and down
// projections), and out[n, w.rows] = silu(gate) · (x · wᵀ) (SwiGLU after the up projection; out may be gate).
// On the CPU they are matmul_nt into the caller's scratch tmp[n, w.rows], then add_inplace / swiglu: the same
// values as those calls; a device does not touch tmp (its f32 arithmetic is the same as its unfused ops').
void matmul_nt_residual(const Context& ctx, const float* x, int64_t n, const WeightView& w, float* h, float* tmp);
void matmul_nt_swiglu(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* gate, float* out,
                      float* tmp);

// y[n, w.rows] += x[n, w.cols] · wᵀ: matmul_nt summing into y instead of overwriting it (no bias; dense
// f32 / f16 / bf16 weights), for the backward's products, which add into the caller's gradients.
void matmul_nt_add(const Context& ctx, const float* x, int64_t n, const WeightView& w, float* y);

// y[m, k] += a[n, m]ᵀ · b[n, k]: the backward's dW = dyᵀ·x, summing over the rows of a and b, which are
// read in the layout they have (no transposed copies). bf16_backward(ctx): a and b rounded to bf16, f32
// sums (the fast kernel: AMX-BF16 tiles where the CPU and OS allow them, else AVX512_BF16); otherwise
// the reference kernel in f32. The result does not depend on the thread count.
void matmul_tn_add(const Context& ctx, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y);
// y[m, k] = a[n, m]ᵀ · b[n, k]: matmul_tn_add overwriting y (zeros when n = 0), the same values bit for bit
// as matmul_tn_add into a zeroed y (the first gradient of a step, written without zeroing it first).
void matmul_tn(const Context& ctx, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y);

// The kPanels copy (ops/weight.h) of a weight, as pack_panels writes it.
struct PanelSizes {
  int64_t panels = 0;       // panels of panel_rows rows
  int64_t panel_rows = 0;   // 64 (bf16) or 32 (quantized)
  int64_t data_bytes = 0;   // the re-laid data
  int64_t table_bytes = 0;  // kQ4: each of the re-laid scale and min tables (kQ8 keeps its row scales)
};
// Sizes of w's kPanels copy; panels == 0 when w has none (already packed, f32 / f16, or kQ4 with
// group_size % 32 != 0).
PanelSizes panel_sizes(const WeightView& w);

// Whether the kernels ctx picks would read w in the kPanels layout without re-packing it: bf16 weights
// at MatmulPrecision::kBF16 with AVX512_BF16, q8 / q4 weights with AVX-512 VNNI (not the reference
// kernels). Elsewhere a packed weight still works, with the same results, but gains nothing.
bool worth_packing(const Context& ctx, const WeightView& w);

// Writes panels [panel_begin, panel_end) of w's kPanels copy into `data` (the whole copy,
// panel_sizes(w).data_bytes, 64-byte aligned) and, kQ4, `scales` / `mins` (table_bytes each), threaded
// on ctx.pool; returns the view of the whole copy (valid once every panel is written). matmul_nt gives
// the same results on it as on w, with every kernel. Chunks let a caller release w's pages as it goes.
// Precondition: panel_sizes(w).panels > 0; quantized weights need cpu::cpu_has_avx512_vnni().
WeightView pack_panels(const Context& ctx, const WeightView& w, void* data, void* scales, void* mins,
                       int64_t panel_begin, int64_t panel_end);

// Wᵀ [w.cols, w.rows] viewed over the words of w's bf16 kPanels copy (kPanelsTransposed, ops/weight.h):
// no copy; matmul_nt on it computes x·W, the fast bf16 kernel re-pairing each block as it packs it.
WeightView transposed_panels(const WeightView& w);

// The view of w's kPanels copy already written at `data` (and, kQ4, `scales` / `mins`), e.g. by an
// earlier pack_panels whose bytes were saved and mapped again; what pack_panels returns.
WeightView panel_view(const WeightView& w, const void* data, const void* scales, const void* mins);

// Whether a backward adds its weight gradients into the caller's buffers or overwrites them (the first
// micro-batch of an optimizer step: no zeroing pass over the gradients, and the dW products do not read
// them). The same values bit for bit as adding into zeroed buffers.
enum class GradWrite { kAdd, kOverwrite };

// Backward of y = x·wᵀ + bias (training), adding into the caller's buffers:
//   dx[n, w.cols] += dy·w      dw[w.rows, w.cols] += dyᵀ·x      dbias[w.rows] += Σ_rows dy
// (dw and dbias overwritten instead with `write` kOverwrite). Any of dx, dw, dbias may be nullptr (not wanted). w must be dense (f32 / f16 / bf16), or without dw any kind (a frozen quantized base: its rows dequantized). The products sum
// straight into dx and dw (the fast kernels unless ctx.reference_kernels): in f32 through matmul_nt_add
// on transposed f32 copies, or, when bf16_backward(ctx) (mixed precision), with bf16 operands and f32
// accumulation: dx through matmul_nt_add against `wt` = wᵀ [w.cols, w.rows] in bf16 (kPanels, or the
// forward's copy viewed as kPanelsTransposed; without it a bf16 wᵀ is made per call), dw through
// matmul_tn_add on dy and x as they are (no copies).
// dx_write kOverwrite: dx = dy·w instead (no zeroing pass over dx before the first product into it), the
// same values bit for bit as adding into a zeroed dx.
// On a device (Context::device kVulkan; n > 0) every operand but w is the device's memory and the products
// are f32 (shaders/matmul_backward.comp; wt is not used: the device reads w as uploaded).
void matmul_nt_backward(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* dy,
                        float* dx, float* dw, float* dbias, const WeightView* wt = nullptr,
                        GradWrite write = GradWrite::kAdd, GradWrite dx_write = GradWrite::kAdd);

// True when matmul_nt_backward runs its products in bf16: ctx.matmul_precision kBF16 on a CPU with
// AVX512_BF16, fast kernels.
bool bf16_backward(const Context& ctx);

// Writes wᵀ [w.cols, w.rows] rounded to bf16 into `data` (row-major, w.rows · w.cols bf16), threaded; any
// weight kind and layout (quantized ones dequantized row by row).
void transpose_to_bf16(const Context& ctx, const WeightView& w, uint16_t* data);

}  // namespace dc
