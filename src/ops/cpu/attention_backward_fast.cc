// CPU attention backward as GEMMs (the fast kernel of ops/attention.h's attention_backward): per (batch,
// KV head) work item and per query head of its group, with the head's Q, K, V, dO gathered into
// contiguous [L, D] tiles,
//   S = Q·Kᵀ·scale → P = softmax(S) over the valid keys      dP = dO·Vᵀ      δ_i = Σ_t dO[i,t]·O[i,t]
//   dS = P ⊙ (dP − δ)·scale      dQ = dS·K      dK += dSᵀ·Q      dV += Pᵀ·dO
// each product through the fast f32 matmul kernel on the calling thread (the items are the parallelism).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"

namespace dc::cpu {
namespace {

// y [rows, cols] = x [cols, rows]ᵀ
void transpose_into(const float* x, int64_t rows, int64_t cols, float* y) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) y[r * cols + c] = x[c * rows + r];
}

// y[n, m] = x[n, k] · w[m, k]ᵀ on this thread, f32.
void gemm_nt(Workspace& ws, const float* x, int64_t n, const float* w, int64_t m, int64_t k, float* y) {
  matmul_nt_fast(nullptr, ws, x, n, WeightView{DType::kF32, w, m, k}, nullptr, y, MatmulPrecision::kF32);
}

}  // namespace

void attention_backward_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& s, const float* q, const float* k,
                             const float* v, const uint8_t* valid, const float* out, const float* dout, float* dq,
                             float* dk, float* dv) {
  const int64_t B = s.n_batch, L = s.n_seq, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  const int64_t group = H / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = H * D, kv_stride = Hkv * D;
  parallel_for(pool, B * Hkv, [&](int64_t begin, int64_t end) {
    // [L, D] tiles, their transposes [D, L], and [L, L] score-sized buffers.
    std::vector<float> qh(L * D), kh(L * D), vh(L * D), doh(L * D), kt(D * L), qt(D * L), dot_(D * L);
    std::vector<float> p(L * L), dp(L * L), tr(L * L), res(L * D), dk_acc(L * D), dv_acc(L * D), delta(L);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, hk = item % Hkv;
      const uint8_t* rv = valid ? valid + b * L : nullptr;
      auto ok = [&](int64_t i) { return rv == nullptr || rv[i] != 0; };
      for (int64_t j = 0; j < L; ++j) {
        std::copy_n(k + (b * L + j) * kv_stride + hk * D, D, kh.data() + j * D);
        std::copy_n(v + (b * L + j) * kv_stride + hk * D, D, vh.data() + j * D);
      }
      transpose_into(kh.data(), D, L, kt.data());
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i = 0; i < L; ++i) {
          const int64_t o = (b * L + i) * q_stride + h * D;
          std::copy_n(q + o, D, qh.data() + i * D);
          std::copy_n(dout + o, D, doh.data() + i * D);
          float d = 0;
          for (int64_t t = 0; t < D; ++t) d += dout[o + t] * out[o + t];
          delta[i] = d;
        }
        gemm_nt(ws, qh.data(), L, kh.data(), L, D, p.data());    // S [L, L]
        gemm_nt(ws, doh.data(), L, vh.data(), L, D, dp.data());  // dP [L, L]
        for (int64_t i = 0; i < L; ++i) {
          float* pi = p.data() + i * L;
          float* dpi = dp.data() + i * L;
          if (!ok(i)) {  // a padding query: no output, no gradient
            std::fill_n(pi, L, 0.0f);
            std::fill_n(dpi, L, 0.0f);
            continue;
          }
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < L; ++j)
            if (ok(j)) mx = std::max(mx, pi[j] * scale);
          float sum = 0;
          for (int64_t j = 0; j < L; ++j) {
            pi[j] = ok(j) ? std::exp(pi[j] * scale - mx) : 0.0f;
            sum += pi[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < L; ++j) {
            pi[j] *= inv;
            dpi[j] = pi[j] * (dpi[j] - delta[i]) * scale;  // dS
          }
        }
        // dQ = dS · K: against Kᵀ [D, L]
        gemm_nt(ws, dp.data(), L, kt.data(), D, L, res.data());
        for (int64_t i = 0; i < L; ++i) std::copy_n(res.data() + i * D, D, dq + (b * L + i) * q_stride + h * D);
        // dK += dSᵀ · Q: dSᵀ [L, L] against Qᵀ [D, L]
        transpose_into(dp.data(), L, L, tr.data());
        transpose_into(qh.data(), D, L, qt.data());
        gemm_nt(ws, tr.data(), L, qt.data(), D, L, res.data());
        for (int64_t i = 0; i < L * D; ++i) dk_acc[i] += res[i];
        // dV += Pᵀ · dO: Pᵀ [L, L] against dOᵀ [D, L]
        transpose_into(p.data(), L, L, tr.data());
        transpose_into(doh.data(), D, L, dot_.data());
        gemm_nt(ws, tr.data(), L, dot_.data(), D, L, res.data());
        for (int64_t i = 0; i < L * D; ++i) dv_acc[i] += res[i];
      }
      for (int64_t j = 0; j < L; ++j) {
        std::copy_n(dk_acc.data() + j * D, D, dk + (b * L + j) * kv_stride + hk * D);
        std::copy_n(dv_acc.data() + j * D, D, dv + (b * L + j) * kv_stride + hk * D);
      }
    }
  }, 1);
}

}  // namespace dc::cpu
