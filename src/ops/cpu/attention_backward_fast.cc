// CPU attention backward as GEMMs (the fast kernel of ops/attention.h's attention_backward): per (batch,
// KV head) work item and per query head of its group, with the head's Q, K, V, dO gathered into
// contiguous [L, D] tiles,
//   S = Q·Kᵀ·scale → P = softmax(S) over the valid keys      dP = dO·Vᵀ      δ_i = Σ_t dO[i,t]·O[i,t]
//   dS = P ⊙ (dP − δ)·scale      dQ = dS·K      dK += dSᵀ·Q      dV += Pᵀ·dO
// each product through the fast matmul kernels on the calling thread (the items are the parallelism), the
// softmax / dS row pass in AVX-512 (exp_ps). In f32 every product is an f32 GEMM against transposed
// copies (16 × 16 AVX-512 blocks). With bf16 (mixed precision) S and so P stay f32, the same as the f32
// path's, and the four gradient products take bf16 operands with f32 sums: dP and dQ through the bf16
// matmul_nt kernel against V and Kᵀ rounded once per item, dK and dV through matmul_tn (dSᵀ·Q and Pᵀ·dO
// read as they are: no transposed copies), summing straight into the item's accumulators.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using simd::mask16;

// y [rows, cols] = x [cols, rows]ᵀ on this thread.
void transpose_into(const float* x, int64_t rows, int64_t cols, float* y) { transpose_fast(nullptr, x, cols, rows, y); }

// The keys of [j, j + 16) that are valid (and < L): all of them without a mask.
DC_TARGET_AVX512 DC_INLINE __mmask16 valid16(const uint8_t* rv, int64_t j, int64_t L) {
  const __mmask16 in = mask16(L - j);
  if (rv == nullptr) return in;
  return _mm_mask_cmpneq_epi8_mask(in, _mm_maskz_loadu_epi8(in, rv + j), _mm_setzero_si128());
}

// One query row: p [L] from scores to softmax(scores · scale) over the valid keys (0 elsewhere), and
// dp [L] from dP to dS = p ⊙ (dP − delta) · scale.
DC_TARGET_AVX512 void softmax_ds_row(float* p, float* dp, int64_t L, const uint8_t* rv, float scale, float delta) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < L; j += 16)
    mx = _mm512_mask_max_ps(mx, valid16(rv, j, L), mx, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask16(L - j), p + j), sc));
  const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < L; j += 16) {
    const __mmask16 in = mask16(L - j);
    const __m512 s_j = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(in, p + j), sc, mv);
    const __m512 e = _mm512_maskz_mov_ps(valid16(rv, j, L), simd::exp_ps(s_j));
    _mm512_mask_storeu_ps(p + j, in, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum)), dl = _mm512_set1_ps(delta);
  for (int64_t j = 0; j < L; j += 16) {
    const __mmask16 in = mask16(L - j);
    const __m512 pj = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, p + j), inv);
    _mm512_mask_storeu_ps(p + j, in, pj);
    const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(pj, _mm512_sub_ps(_mm512_maskz_loadu_ps(in, dp + j), dl)), sc);
    _mm512_mask_storeu_ps(dp + j, in, ds);
  }
}

// y[n, m] = x[n, k] · w[m, k]ᵀ on this thread, f32.
void gemm_nt(Workspace& ws, const float* x, int64_t n, const float* w, int64_t m, int64_t k, float* y) {
  matmul_nt_fast(nullptr, ws, x, n, WeightView{DType::kF32, w, m, k}, nullptr, y, MatmulPrecision::kF32);
}

// y[n, m] = x[n, k] · w[m, k]ᵀ on this thread, x rounded to bf16, w already bf16, f32 sums.
void gemm_nt_bf16(Workspace& ws, const float* x, int64_t n, const uint16_t* w, int64_t m, int64_t k, float* y) {
  matmul_nt_fast(nullptr, ws, x, n, WeightView{DType::kBF16, w, m, k}, nullptr, y, MatmulPrecision::kBF16);
}

}  // namespace

void attention_backward_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& s, const float* q, const float* k,
                             const float* v, const uint8_t* valid, const float* out, const float* dout, float* dq,
                             float* dk, float* dv, bool bf16) {
  const int64_t B = s.n_batch, L = s.n_seq, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  const int64_t group = H / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_stride = H * D, kv_stride = Hkv * D;
  parallel_for(pool, B * Hkv, [&](int64_t begin, int64_t end) {
    // [L, D] tiles, their transposes [D, L], and [L, L] score-sized buffers.
    const int64_t f32_only = bf16 ? 0 : 1;  // the transposed copies only the f32 products read
    std::vector<float> qh(L * D), kh(L * D), vh(L * D), doh(L * D), kt(f32_only * D * L), qt(f32_only * D * L);
    std::vector<float> dot_(f32_only * D * L);
    std::vector<float> p(L * L), dp(L * L), tr(f32_only * L * L), res(L * D), dk_acc(L * D), dv_acc(L * D), delta(L);
    std::vector<uint16_t> vb(bf16 ? L * D : 0), ktb(bf16 ? D * L : 0);  // bf16: V [L, D], Kᵀ [D, L]
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, hk = item % Hkv;
      const uint8_t* rv = valid ? valid + b * L : nullptr;
      auto ok = [&](int64_t i) { return rv == nullptr || rv[i] != 0; };
      for (int64_t j = 0; j < L; ++j) {
        std::copy_n(k + (b * L + j) * kv_stride + hk * D, D, kh.data() + j * D);
        std::copy_n(v + (b * L + j) * kv_stride + hk * D, D, vh.data() + j * D);
      }
      if (bf16) {
        for (int64_t i = 0; i < L * D; ++i) vb[i] = f32_to_bf16(vh[i]);
        transpose_bf16_fast(nullptr, kh.data(), L, D, ktb.data());
      } else {
        transpose_into(kh.data(), D, L, kt.data());
      }
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
        if (bf16) gemm_nt_bf16(ws, doh.data(), L, vb.data(), L, D, dp.data());  // dP [L, L]
        else gemm_nt(ws, doh.data(), L, vh.data(), L, D, dp.data());
        for (int64_t i = 0; i < L; ++i) {
          float* pi = p.data() + i * L;
          float* dpi = dp.data() + i * L;
          if (!ok(i)) {  // a padding query: no output, no gradient
            std::fill_n(pi, L, 0.0f);
            std::fill_n(dpi, L, 0.0f);
            continue;
          }
          softmax_ds_row(pi, dpi, L, rv, scale, delta[i]);
        }
        // dQ = dS · K: against Kᵀ [D, L]
        if (bf16) gemm_nt_bf16(ws, dp.data(), L, ktb.data(), D, L, res.data());
        else gemm_nt(ws, dp.data(), L, kt.data(), D, L, res.data());
        for (int64_t i = 0; i < L; ++i) std::copy_n(res.data() + i * D, D, dq + (b * L + i) * q_stride + h * D);
        if (bf16) {  // dK += dSᵀ · Q, dV += Pᵀ · dO, the operands as they are
          matmul_tn_fast(nullptr, ws, dp.data(), L, L, qh.data(), D, dk_acc.data(), true);
          matmul_tn_fast(nullptr, ws, p.data(), L, L, doh.data(), D, dv_acc.data(), true);
          continue;
        }
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
