// LoRA projections: the adapter's two small products beside the base's (model/lora_project.h).
#include "model/lora_project.h"

#include <algorithm>

#include "core/check.h"
#include "core/splitmix64.h"
#include "core/thread_pool.h"

namespace dc {

bool lora_dropout_keeps(uint64_t key, int64_t il, int t, int64_t row, int64_t col, float p) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(key ^ (static_cast<uint64_t>(il) << 8 | static_cast<uint64_t>(t))) ^
                                           static_cast<uint64_t>(row)) ^ static_cast<uint64_t>(col));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) >= static_cast<double>(p);
}

namespace {

// x_d [T, in] = x ⊙ keep / (1 − p) of site's dropout, or x itself (no dropout or not training).
const float* dropped_input(const Context& ctx, const float* x, int64_t T, int64_t in, const LoraSite& site,
                           bool training, std::vector<float>& storage) {
  const float p = site.lora->dropout;
  if (!training || p <= 0.0f) return x;
  storage.resize(static_cast<size_t>(T * in));
  const float keep_scale = 1.0f / (1.0f - p);
  parallel_for(ctx.pool, T, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (int64_t c = 0; c < in; ++c)
        storage[i * in + c] =
            lora_dropout_keeps(site.lora->dropout_key, site.il, site.t, i, c, p) ? x[i * in + c] * keep_scale : 0.0f;
  });
  return storage.data();
}

// m [rows, cols] → its transpose [cols, rows].
std::vector<float> transposed(const float* m, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;
}

}  // namespace

void lora_project(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* bias, float* y,
                  const LoraSite& site, bool training, std::vector<float>* u) {
  matmul_nt(ctx, x, T, w, bias, y);
  const LoraMatrix* m = site.matrix();
  if (m == nullptr) return;
  const int64_t in = w.cols, out = w.rows, r = m->r;
  std::vector<float> x_storage, u_local;
  const float* xd = dropped_input(ctx, x, T, in, site, training, x_storage);
  std::vector<float>& uu = u != nullptr ? *u : u_local;
  uu.resize(static_cast<size_t>(T * r));
  matmul_nt(ctx, xd, T, WeightView{DType::kF32, m->a, r, in}, nullptr, uu.data());  // u [T, r] = x_d·Aᵀ
  std::vector<float> su(uu.size());                                                   // [T, r] scale·u
  for (size_t i = 0; i < su.size(); ++i) su[i] = m->scale * uu[i];
  matmul_nt_add(ctx, su.data(), T, WeightView{DType::kF32, m->b, out, r}, y);         // y += su·Bᵀ
}

void lora_project_backward(const Context& ctx, const float* x, int64_t T, const WeightView& w, const float* dy,
                           float* dx, float* dw, float* dbias, const WeightView* wt, GradWrite write,
                           GradWrite dx_write, const LoraSite& site, const std::vector<float>& u,
                           const LoraGradMatrix* g) {
  matmul_nt_backward(ctx, x, T, w, dy, dx, dw, dbias, wt, write, dx_write);
  const LoraMatrix* m = site.matrix();
  if (m == nullptr || T == 0) return;
  const int64_t in = w.cols, out = w.rows, r = m->r;
  DC_CHECK(static_cast<int64_t>(u.size()) == T * r, "lora_project_backward: u is not this forward's");
  std::vector<float> su(u.size());  // [T, r]
  for (size_t i = 0; i < su.size(); ++i) su[i] = m->scale * u[i];
  if (g != nullptr) matmul_tn_add(ctx, dy, T, out, su.data(), r, g->b);  // dB [out, r] += dyᵀ·su
  const std::vector<float> bt = transposed(m->b, out, r);                 // Bᵀ [r, out]
  std::vector<float> du(static_cast<size_t>(T * r));                      // [T, r] scale·dy·B
  matmul_nt(ctx, dy, T, WeightView{DType::kF32, bt.data(), r, out}, nullptr, du.data());
  for (float& d : du) d *= m->scale;
  std::vector<float> x_storage;
  const float* xd = dropped_input(ctx, x, T, in, site, /*training=*/true, x_storage);
  if (g != nullptr) matmul_tn_add(ctx, du.data(), T, r, xd, in, g->a);  // dA [r, in] += duᵀ·x_d
  if (dx == nullptr) return;
  const std::vector<float> at = transposed(m->a, r, in);  // Aᵀ [in, r]
  const WeightView a_t{DType::kF32, at.data(), in, r};
  const float p = site.lora->dropout;
  if (p <= 0.0f) return matmul_nt_add(ctx, du.data(), T, a_t, dx);  // dx += du·A
  std::vector<float> dxd(static_cast<size_t>(T * in));              // [T, in] ∂/∂x_d, then through the mask
  matmul_nt(ctx, du.data(), T, a_t, nullptr, dxd.data());
  const float keep_scale = 1.0f / (1.0f - p);
  parallel_for(ctx.pool, T, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (int64_t c = 0; c < in; ++c)
        if (lora_dropout_keeps(site.lora->dropout_key, site.il, site.t, i, c, p)) dx[i * in + c] += dxd[i * in + c] * keep_scale;
  });
}

}  // namespace dc
