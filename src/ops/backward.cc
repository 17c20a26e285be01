// Front-ends of the backward ops and the fused cross-entropy: check the arguments once, dispatch to
// the CPU kernels (ops/cpu/backward_kernels.h) or, on a device, to its backend (ops/device.h). On the CPU
// matmul_nt_backward reuses matmul_nt_add (dx; in f32 on transposed copies) and matmul_tn_add (dW in mixed
// precision, on the operands as they are).
#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/profiler.h"
#include "core/workspace.h"
#include "ops/attention.h"
#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/matmul.h"

namespace dc {

void rms_norm_backward(const Context& ctx, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                       float eps, float* dx, float* dw) {
  const ProfileScope profile(ctx, "rms_norm_backward");
  DC_CHECK(x != nullptr && w != nullptr && dy != nullptr && n >= 0 && d > 0, "rms_norm_backward: bad arguments");
  if (ctx.device == Device::kVulkan)
    return ctx.backend->rms_norm_backward(as_device(x), w, as_device(dy), n, d, eps, as_device(dx), as_device(dw));
  if (ctx.reference_kernels) return cpu::rms_norm_backward(ctx.pool, x, w, dy, n, d, eps, dx, dw);
  cpu::rms_norm_backward_fast(ctx.pool, x, w, dy, n, d, eps, dx, dw);
}

void rope_backward(const Context& ctx, float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin) {
  const ProfileScope profile(ctx, "rope_backward");
  DC_CHECK(dx != nullptr && cos != nullptr && sin != nullptr && head_dim % 2 == 0, "rope_backward: bad arguments");
  if (ctx.device == Device::kVulkan) return ctx.backend->rope_backward(as_device(dx), n, n_heads, head_dim, as_device(cos), as_device(sin));
  if (ctx.reference_kernels) return cpu::rope_backward(ctx.pool, dx, n, n_heads, head_dim, cos, sin);
  cpu::rope_apply_fast(ctx.pool, dx, n, n_heads, head_dim, cos, sin, /*inverse=*/true);  // a rotation's transpose
}

void swiglu_backward(const Context& ctx, const float* gate, const float* up, const float* dout, int64_t count,
                     float* dgate, float* dup) {
  const ProfileScope profile(ctx, "swiglu_backward");
  DC_CHECK(gate && up && dout && dgate && dup && count >= 0, "swiglu_backward: bad arguments");
  if (ctx.device == Device::kVulkan)
    return ctx.backend->swiglu_backward(as_device(gate), as_device(up), as_device(dout), count, as_device(dgate), as_device(dup));
  if (ctx.reference_kernels) return cpu::swiglu_backward(ctx.pool, gate, up, dout, count, dgate, dup);
  cpu::swiglu_backward_fast(ctx.pool, gate, up, dout, count, dgate, dup);
}

void embedding_backward(const Context& ctx, const int32_t* ids, int64_t n, const float* dy, int64_t cols,
                        float* dtable) {
  const ProfileScope profile(ctx, "embedding_backward");
  DC_CHECK(ids && dy && dtable && n >= 0 && cols > 0, "embedding_backward: bad arguments");
  if (ctx.device == Device::kVulkan) return ctx.backend->embedding_backward(as_device(ids), n, as_device(dy), cols, as_device(dtable));
  cpu::embedding_backward(ctx.pool, ids, n, dy, cols, dtable);
}

void attention_backward(const Context& ctx, const AttentionShape& s, const float* q, const float* k, const float* v,
                        const uint8_t* valid, const float* out, const float* dout, float* dq, float* dk,
                        float* dv) {
  const ProfileScope profile(ctx, "attention_backward");
  DC_CHECK(q && k && v && out && dout && dq && dk && dv, "attention_backward: null operand");
  DC_CHECK(s.n_batch > 0 && s.n_seq > 0 && s.head_dim > 0 && s.n_head_kv > 0 && s.n_head % s.n_head_kv == 0,
           "attention_backward: bad shape");
  if (ctx.device == Device::kVulkan)
    return ctx.backend->attention_backward(s, as_device(q), as_device(k), as_device(v), as_device(valid), as_device(out), as_device(dout),
                                           as_device(dq), as_device(dk), as_device(dv));
  if (ctx.reference_kernels || !cpu::cpu_has_avx512()) return cpu::attention_backward(ctx.pool, s, q, k, v, valid, out, dout, dq, dk, dv);
  Workspace own_workspace;  // the GEMMs' block buffers: ctx's, or (without one) this call's
  cpu::attention_backward_fast(ctx.pool, ctx.workspace != nullptr ? *ctx.workspace : own_workspace, s, q, k, v, valid,
                               out, dout, dq, dk, dv, bf16_backward(ctx));
}

bool bf16_backward(const Context& ctx) {
  return ctx.device == Device::kCpu && !ctx.reference_kernels && ctx.matmul_precision == MatmulPrecision::kBF16 &&
         cpu::cpu_has_avx512_bf16();
}

void transpose_to_bf16(const Context& ctx, const WeightView& w, uint16_t* data) {
  DC_CHECK(!w.empty(), "transpose_to_bf16: bad operand");
  const int64_t rows = w.rows, cols = w.cols;
  if (bf16_backward(ctx) && !w.quantized() && w.dtype == DType::kF32 && w.layout == WeightLayout::kRowMajor)
    return cpu::transpose_bf16_fast(ctx.pool, static_cast<const float*>(w.data), rows, cols, data);
  constexpr int64_t kTile = 64;
  parallel_for(ctx.pool, (rows + kTile - 1) / kTile, [&](int64_t b, int64_t e) {
    std::vector<float> tile(static_cast<size_t>(kTile * cols));  // [kTile, cols]
    for (int64_t r0 = b * kTile; r0 < std::min(rows, e * kTile); r0 += kTile) {
      const int64_t nr = std::min(kTile, rows - r0);
      for (int64_t i = 0; i < nr; ++i) w.row_to_f32(r0 + i, tile.data() + i * cols);
      for (int64_t c = 0; c < cols; ++c)  // 64 consecutive outputs per column
        for (int64_t i = 0; i < nr; ++i) data[c * rows + r0 + i] = f32_to_bf16(tile[i * cols + c]);
    }
  });
}

namespace {

// y[cols, rows] = x[rows, cols]ᵀ: the fast kernel unless ctx.reference_kernels (the same values).
void transpose(const Context& ctx, const float* x, int64_t rows, int64_t cols, float* y) {
  if (ctx.reference_kernels) return cpu::transpose(ctx.pool, x, rows, cols, y);
  cpu::transpose_fast(ctx.pool, x, rows, cols, y);
}

}  // namespace

void matmul_nt_backward(const Context& ctx, const float* x, int64_t n, const WeightView& w, const float* dy,
                        float* dx, float* dw, float* dbias, const WeightView* wt, GradWrite write,
                        GradWrite dx_write) {
  const ProfileScope profile(ctx, [&] { return "matmul_nt_backward, W " + std::to_string(w.rows) + "×" + std::to_string(w.cols); });
  DC_CHECK(x != nullptr && dy != nullptr && !w.empty() && !(w.quantized() && dw != nullptr), "matmul_nt_backward: bad operand");
  DC_CHECK(wt == nullptr || (wt->rows == w.cols && wt->cols == w.rows), "matmul_nt_backward: wt is not wᵀ");
  const int64_t out = w.rows, in = w.cols;
  const bool add = write == GradWrite::kAdd;
  if (ctx.device == Device::kVulkan) {  // wt unused: the device reads w as it was uploaded
    DC_CHECK(n > 0, "matmul_nt_backward: a device's backward needs rows");
    return ctx.backend->matmul_nt_backward(as_device(x), n, w, as_device(dy), as_device(dx), as_device(dw), as_device(dbias),
                                           dx_write == GradWrite::kAdd, add);
  }
  if (n == 0) {  // no rows: nothing to add, zeros to write
    if (!add && dw != nullptr) std::fill(dw, dw + out * in, 0.0f);
    if (!add && dbias != nullptr) std::fill(dbias, dbias + out, 0.0f);
    return;
  }
  // The temporaries live in ctx.workspace (the trainer's), reused across calls: a fresh [out, in]
  // allocation per call (0.5 GB for a 0.5B model's lm_head) cost more in zero-filling and page faults
  // than the GEMM it feeds. They keep the largest size seen. Without a workspace, this call's own.
  Workspace own_workspace;
  Workspace& ws = ctx.workspace != nullptr ? *ctx.workspace : own_workspace;
  // dx += dy·v or, dx_write kOverwrite, dx = dy·v, with v = wᵀ [in, out] (matmul_nt_add's kernels).
  auto dx_product = [&](const WeightView& v) {
    const bool accumulate = dx_write == GradWrite::kAdd;
    if (ctx.reference_kernels) return cpu::matmul_nt(ctx.pool, dy, n, v, nullptr, dx, accumulate);
    cpu::matmul_nt_fast(ctx.pool, ws, dy, n, v, nullptr, dx, ctx.matmul_precision, accumulate);
  };
  // bf16 buffers as halves of f32 ones.
  auto bf16_buffer = [&](const char* name, int64_t count) {
    return reinterpret_cast<uint16_t*>(ws.floats(name, (count + 1) / 2));
  };
  if (bf16_backward(ctx)) {  // mixed precision: bf16 operands (the kernels round dy and x), f32 sums
    if (dx != nullptr) {
      const ProfileScope p(ctx, "dx = dy·W GEMM");
      WeightView t = wt != nullptr ? *wt : WeightView{};
      if (wt == nullptr) {
        uint16_t* tb = bf16_buffer("matmul_backward.wt_bf16", in * out);  // [in, out]
        transpose_to_bf16(ctx, w, tb);
        t = WeightView{DType::kBF16, tb, in, out};
      }
      dx_product(t);
    }
    if (dw != nullptr) {
      const ProfileScope p(ctx, "dW = dyᵀ·x GEMM");
      if (add) matmul_tn_add(ctx, dy, n, out, x, in, dw);
      else matmul_tn(ctx, dy, n, out, x, in, dw);
    }
  } else {
    float* dyt = ws.floats("matmul_backward.dyt", out * n);  // [out, n]
    {
      const ProfileScope p(ctx, "transpose dy");
      transpose(ctx, dy, n, out, dyt);
    }
    if (dx != nullptr) {  // dx = dy · w = dy · (wᵀ)ᵀ: matmul_nt against wᵀ [in, out]
      float* w_t = ws.floats("matmul_backward.wt", in * out);  // [in, out]
      if (w.dtype == DType::kF32 && !w.quantized() && w.layout == WeightLayout::kRowMajor) {
        transpose(ctx, static_cast<const float*>(w.data), out, in, w_t);
      } else {
        float* dense = ws.floats("matmul_backward.dense", out * in);  // [out, in]
        for (int64_t r = 0; r < out; ++r) w.row_to_f32(r, dense + r * in);
        transpose(ctx, dense, out, in, w_t);
      }
      dx_product(WeightView{DType::kF32, w_t, in, out});
    }
    if (dw != nullptr) {  // dw = dyᵀ · x = dyᵀ · (xᵀ)ᵀ: matmul_nt of dyᵀ [out, n] against xᵀ [in, n]
      float* xt = ws.floats("matmul_backward.xt", in * n);  // [in, n]
      transpose(ctx, x, n, in, xt);
      const WeightView x_t{DType::kF32, xt, in, n};
      if (add) matmul_nt_add(ctx, dyt, out, x_t, dw);
      else matmul_nt(ctx, dyt, out, x_t, nullptr, dw);
    }
  }
  if (dbias != nullptr) {  // Σ_rows dy over 16 columns at a time, rows in order, in double
    const ProfileScope p(ctx, "dbias");
    constexpr int64_t kCols = 16;
    // A few hundred thousand additions (the 0.5B shape's q/k/v biases): cheaper than waking the pool.
    ThreadPool* pool = n * out < (int64_t{1} << 20) ? nullptr : ctx.pool;
    parallel_for(pool, (out + kCols - 1) / kCols, [&](int64_t b, int64_t e) {
      for (int64_t o0 = b * kCols; o0 < std::min(out, e * kCols); o0 += kCols) {
        const int64_t nc = std::min(kCols, out - o0);
        double sum[kCols] = {};
        for (int64_t i = 0; i < n; ++i)
          for (int64_t o = 0; o < nc; ++o) sum[o] += dy[i * out + o0 + o];
        for (int64_t o = 0; o < nc; ++o) dbias[o0 + o] = (add ? dbias[o0 + o] : 0.0f) + static_cast<float>(sum[o]);
      }
    });
  }
}

double cross_entropy(const Context& ctx, const float* logits, const int32_t* targets, const float* weights,
                     int64_t n, int64_t n_vocab, float* dlogits, float* ce) {
  const ProfileScope profile(ctx, "cross_entropy");
  DC_CHECK(logits && targets && weights && n >= 0 && n_vocab > 0, "cross_entropy: bad arguments");
  DC_CHECK(ctx.device == Device::kCpu, "cross_entropy: its sum is a host number; on a device use cross_entropy_rows");
  if (ctx.reference_kernels) return cpu::cross_entropy(ctx.pool, logits, targets, weights, n, n_vocab, dlogits, ce);
  return cpu::cross_entropy_fast(ctx.pool, logits, targets, weights, n, n_vocab, dlogits, ce);
}

void cross_entropy_rows(const Context& ctx, const float* logits, const int32_t* targets, const float* weights, int64_t n,
                        int64_t n_vocab, float* dlogits, float* ce, float* loss) {
  DC_CHECK(logits && targets && weights && loss && n > 0 && n_vocab > 0, "cross_entropy_rows: bad arguments");
  switch (ctx.device) {
    case Device::kCpu:
      *loss = static_cast<float>(cross_entropy(ctx, logits, targets, weights, n, n_vocab, dlogits, ce));
      return;
    case Device::kVulkan: {
      const ProfileScope profile(ctx, "cross_entropy");
      return ctx.backend->cross_entropy(as_device(logits), as_device(targets), as_device(weights), n, n_vocab, as_device(dlogits),
                                        as_device(ce), as_device(loss));
    }
  }
}

}  // namespace dc
