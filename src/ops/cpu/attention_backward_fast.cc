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
    // [L, D] tiles, their transposes [D, L] (f32 only), [L, L] score-sized buffers, the bf16 copies of K
    // and V: this thread's buffers of ws, kept for the next call (no allocation, no page faults per call).
    const int64_t n_t = bf16 ? 0 : D * L, n_tr = bf16 ? 0 : L * L, half = bf16 ? (L * D + 1) / 2 : 0;
    float* buf = ws.thread_buffer<float>("attention_backward", 7 * L * D + 3 * n_t + 2 * L * L + n_tr + L + 2 * half);
    float *qh = buf, *kh = qh + L * D, *vh = kh + L * D, *doh = vh + L * D, *res = doh + L * D;
    float *dk_acc = res + L * D, *dv_acc = dk_acc + L * D, *kt = dv_acc + L * D, *qt = kt + n_t, *dot_ = qt + n_t;
    float *p = dot_ + n_t, *dp = p + L * L, *tr = dp + L * L, *delta = tr + n_tr;
    uint16_t* vb = reinterpret_cast<uint16_t*>(delta + L);  // bf16: V [L, D], Kᵀ [D, L]
    uint16_t* ktb = reinterpret_cast<uint16_t*>(delta + L + half);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / Hkv, hk = item % Hkv;
      const uint8_t* rv = valid ? valid + b * L : nullptr;
      auto ok = [&](int64_t i) { return rv == nullptr || rv[i] != 0; };
      for (int64_t j = 0; j < L; ++j) {
        std::copy_n(k + (b * L + j) * kv_stride + hk * D, D, kh + j * D);
        std::copy_n(v + (b * L + j) * kv_stride + hk * D, D, vh + j * D);
      }
      if (bf16) {
        for (int64_t i = 0; i < L * D; ++i) vb[i] = f32_to_bf16(vh[i]);
        transpose_bf16_fast(nullptr, kh, L, D, ktb);
      } else {
        transpose_into(kh, D, L, kt);
      }
      std::fill_n(dk_acc, L * D, 0.0f);
      std::fill_n(dv_acc, L * D, 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t i = 0; i < L; ++i) {
          const int64_t o = (b * L + i) * q_stride + h * D;
          std::copy_n(q + o, D, qh + i * D);
          std::copy_n(dout + o, D, doh + i * D);
          float d = 0;
          for (int64_t t = 0; t < D; ++t) d += dout[o + t] * out[o + t];
          delta[i] = d;
        }
        gemm_nt(ws, qh, L, kh, L, D, p);    // S [L, L]
        if (bf16) gemm_nt_bf16(ws, doh, L, vb, L, D, dp);  // dP [L, L]
        else gemm_nt(ws, doh, L, vh, L, D, dp);
        for (int64_t i = 0; i < L; ++i) {
          float* pi = p + i * L;
          float* dpi = dp + i * L;
          if (!ok(i)) {  // a padding query: no output, no gradient
            std::fill_n(pi, L, 0.0f);
            std::fill_n(dpi, L, 0.0f);
            continue;
          }
          softmax_ds_row(pi, dpi, L, rv, scale, delta[i]);
        }
        // dQ = dS · K: against Kᵀ [D, L]
        if (bf16) gemm_nt_bf16(ws, dp, L, ktb, D, L, res);
        else gemm_nt(ws, dp, L, kt, D, L, res);
        for (int64_t i = 0; i < L; ++i) std::copy_n(res + i * D, D, dq + (b * L + i) * q_stride + h * D);
        if (bf16) {  // dK += dSᵀ · Q, dV += Pᵀ · dO, the operands as they are
          matmul_tn_fast(nullptr, ws, dp, L, L, qh, D, dk_acc, true);
          matmul_tn_fast(nullptr, ws, p, L, L, doh, D, dv_acc, true);
          continue;
        }
        // dK += dSᵀ · Q: dSᵀ [L, L] against Qᵀ [D, L]
        transpose_into(dp, L, L, tr);
        transpose_into(qh, D, L, qt);
        gemm_nt(ws, tr, L, qt, D, L, res);
        for (int64_t i = 0; i < L * D; ++i) dk_acc[i] += res[i];
        // dV += Pᵀ · dO: Pᵀ [L, L] against dOᵀ [D, L]
        transpose_into(p, L, L, tr);
        transpose_into(doh, D, L, dot_);
        gemm_nt(ws, tr, L, dot_, D, L, res);
        for (int64_t i = 0; i < L * D; ++i) dv_acc[i] += res[i];
      }
      for (int64_t j = 0; j < L; ++j) {
        std::copy_n(dk_acc + j * D, D, dk + (b * L + j) * kv_stride + hk * D);
        std::copy_n(dv_acc + j * D, D, dv + (b * L + j) * kv_stride + hk * D);
      }
    }
  }, 1);
}

}  // namespace dc::cpu
