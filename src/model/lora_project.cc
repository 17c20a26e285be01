// LoRA projections: the adapter's two small products beside the base's (model/lora_project.h).
#include "model/lora_project.h"

#include <algorithm>

#include "core/check.h"
#include "core/splitmix64.h"
#include "ops/device.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"

namespace dc {

namespace {

// The seed of site's dropout mask: the adapter's key mixed with the layer and the target, so that each
// projection draws its own mask (ops/dropout.h: a function of (seed, row, column)).
uint64_t dropout_seed(const LoraSite& site) {
  return splitmix64(site.lora->dropout_key ^ (static_cast<uint64_t>(site.il) << 8 | static_cast<uint64_t>(site.t)));
}

// x_d [T, in] = dropout(x) with site's mask (x ⊙ keep / (1 − p)), or x itself (no dropout or not training): on
// the CPU into `storage`, on a device into its buffer `name` (null after a device error, which finish() returns).
const float* dropped_input(const Context& ctx, const float* x, int64_t T, int64_t in, const LoraSite& site,
                           bool training, std::vector<float>& storage, const char* name) {
  const float p = site.lora->dropout;
  if (!training || p <= 0.0f) return x;
  float* xd = nullptr;
  if (ctx.device == Device::kCpu) {
    storage.resize(static_cast<size_t>(T * in));
    xd = storage.data();
  } else if (xd = device_floats(ctx, name, T * in); xd == nullptr) {
    return nullptr;
  }
  dropout_hashed(ctx, x, T, in, dropout_seed(site), p, xd);
  return xd;
}

// m [rows, cols] → its transpose [cols, rows].
std::vector<float> transposed(const float* m, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;
}

// The adapter's product on a device: u = x_d·Aᵀ, y += (scale·u)·Bᵀ, scratch in named buffers.
void lora_project_on_device(const Context& ctx, const float* x, int64_t T, const WeightView& w, float* y,
                            const LoraSite& site, bool training, float* u) {
  const LoraMatrix& m = *site.matrix();
  const int64_t in = w.cols, out = w.rows, r = m.r;
  std::vector<float> unused;
  const float* xd = dropped_input(ctx, x, T, in, site, training, unused, "lora.xd");  // [T, in]
  float* uu = u != nullptr ? u : device_floats(ctx, "lora.u", T * r);                // [T, r]
  float* su = device_floats(ctx, "lora.su", T * r);                                  // [T, r] scale·u
  if (xd == nullptr || uu == nullptr || su == nullptr) return;  // the device's error: finish() returns it
  matmul_nt(ctx, xd, T, WeightView{DType::kF32, m.a, r, in}, nullptr, uu);
  scale_floats(ctx, uu, T * r, m.scale, su);
  matmul_nt_residual(ctx, su, T, WeightView{DType::kF32, m.b, out, r}, y, nullptr);  // y += su·Bᵀ
}

// lora_project_backward's adapter part on a device (the base's dx done): sdy = scale·dy [T, out],
// dB += sdyᵀ·u and du = sdy·B in one product, then dA += duᵀ·x_d and dx += du·A in another (with dropout
// du·A into lora.dxd [T, in], through the forward's mask, then added to dx).
void lora_backward_on_device(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* dy,
                             float* dx, const LoraSite& site, const float* u, const LoraGradMatrix* g) {
  const LoraMatrix& m = *site.matrix();
  const int64_t in = w.cols, out = w.rows, r = m.r;
  float* sdy = device_floats(ctx, "lora.sdy", T * out);
  float* du = device_floats(ctx, "lora.du", T * r);
  if (sdy == nullptr || du == nullptr) return;  // the device's error: finish() returns it
  scale_floats(ctx, dy, T * out, m.scale, sdy);
  matmul_nt_backward(ctx, u, T, WeightView{DType::kF32, m.b, out, r}, sdy, du, g != nullptr ? g->b : nullptr, nullptr,
                     nullptr, GradWrite::kAdd, GradWrite::kOverwrite);
  if (g == nullptr && dx == nullptr) return;
  std::vector<float> unused;
  const float* xd = dropped_input(ctx, x, T, in, site, /*training=*/true, unused, "lora.xd");
  const bool dropping = xd != x;
  float* dxd = dropping && dx != nullptr ? device_floats(ctx, "lora.dxd", T * in) : dx;  // [T, in]
  if (xd == nullptr || (dx != nullptr && dxd == nullptr)) return;
  matmul_nt_backward(ctx, xd, T, WeightView{DType::kF32, m.a, r, in}, du, dxd, g != nullptr ? g->a : nullptr, nullptr,
                     nullptr, GradWrite::kAdd, dropping ? GradWrite::kOverwrite : GradWrite::kAdd);
  if (!dropping || dx == nullptr) return;
  dropout_hashed(ctx, dxd, T, in, dropout_seed(site), site.lora->dropout, dxd);
  add_inplace(ctx, dx, dxd, T * in);
}

}  // namespace

void lora_project(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* bias, float* y,
                  const LoraSite& site, bool training, float* u) {
  matmul_nt(ctx, x, T, w, bias, y);
  const LoraMatrix* m = site.matrix();
  if (m == nullptr) return;
  if (ctx.device != Device::kCpu) return lora_project_on_device(ctx, x, T, w, y, site, training, u);
  const int64_t in = w.cols, out = w.rows, r = m->r;
  std::vector<float> x_storage, u_local;
  const float* xd = dropped_input(ctx, x, T, in, site, training, x_storage, nullptr);
  if (u == nullptr) u_local.resize(static_cast<size_t>(T * r)), u = u_local.data();
  matmul_nt(ctx, xd, T, WeightView{DType::kF32, m->a, r, in}, nullptr, u);  // u [T, r] = x_d·Aᵀ
  std::vector<float> su(static_cast<size_t>(T * r));                        // [T, r] scale·u
  for (size_t i = 0; i < su.size(); ++i) su[i] = m->scale * u[i];
  matmul_nt_add(ctx, su.data(), T, WeightView{DType::kF32, m->b, out, r}, y);  // y += su·Bᵀ
}

void lora_project_backward(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* dy,
                           float* dx, float* dw, float* dbias, const WeightView* wt, GradWrite write,
                           GradWrite dx_write, const LoraSite& site, const float* u, const LoraGradMatrix* g) {
  matmul_nt_backward(ctx, x, T, w, dy, dx, dw, dbias, wt, write, dx_write);
  const LoraMatrix* m = site.matrix();
  if (m == nullptr || T == 0) return;
  DC_CHECK(u != nullptr, "lora_project_backward: no u saved by this projection's forward");
  if (ctx.device != Device::kCpu) return lora_backward_on_device(ctx, x, T, w, dy, dx, site, u, g);
  const int64_t in = w.cols, out = w.rows, r = m->r;
  std::vector<float> su(static_cast<size_t>(T * r));  // [T, r]
  for (size_t i = 0; i < su.size(); ++i) su[i] = m->scale * u[i];
  if (g != nullptr) matmul_tn_add(ctx, dy, T, out, su.data(), r, g->b);  // dB [out, r] += dyᵀ·su
  const std::vector<float> bt = transposed(m->b, out, r);                 // Bᵀ [r, out]
  std::vector<float> du(static_cast<size_t>(T * r));                      // [T, r] scale·dy·B
  matmul_nt(ctx, dy, T, WeightView{DType::kF32, bt.data(), r, out}, nullptr, du.data());
  for (float& d : du) d *= m->scale;
  std::vector<float> x_storage;
  const float* xd = dropped_input(ctx, x, T, in, site, /*training=*/true, x_storage, nullptr);
  if (g != nullptr) matmul_tn_add(ctx, du.data(), T, r, xd, in, g->a);  // dA [r, in] += duᵀ·x_d
  if (dx == nullptr) return;
  const std::vector<float> at = transposed(m->a, r, in);  // Aᵀ [in, r]
  const WeightView a_t{DType::kF32, at.data(), in, r};
  if (xd == x) return matmul_nt_add(ctx, du.data(), T, a_t, dx);  // dx += du·A
  std::vector<float> dxd(static_cast<size_t>(T * in));           // [T, in] ∂/∂x_d, then through the mask
  matmul_nt(ctx, du.data(), T, a_t, nullptr, dxd.data());
  dropout_hashed(ctx, dxd.data(), T, in, dropout_seed(site), site.lora->dropout, dxd.data());
  add_inplace(ctx, dx, dxd.data(), T * in);
}

}  // namespace dc
