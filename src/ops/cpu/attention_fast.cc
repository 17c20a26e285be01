// Fast CPU bidirectional GQA attention of a window of queries over all L keys (the full attention is the
// window [0, L)). Per (batch, kv head) the valid keys are packed once, padding positions dropped:
// Kᵀ [head_dim, keys] and V [keys, 64·⌈head_dim/64⌉]. Then per (batch, kv head, block of window
// positions) the query rows of every head sharing that kv head go together through blocks of 64 keys:
// S = Q·Kᵀ and O += P·V with register-tiled micro-kernels (6 rows × 64 columns), online softmax in
// between; f32 throughout. No W×L buffer; each query row's arithmetic depends neither on the threading
// nor on which rows share its work item. (A bf16 variant, q/k/v/p rounded to bf16 and vdpbf16ps,
// measured 1.3-1.5x faster on this op, ~1.5% of a 0.5B forward at L = 320, but its score errors reach
// ~0.1 for large q·k and move the softmax by several percent: not worth it.)
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/simd_avx512.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12 AVX-512 headers: see matmul_fast.cc
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace dc::cpu {
namespace {

using simd::mask16;

constexpr int kMr = 6;               // query rows per micro-tile
constexpr int64_t kKeyBlock = 64;    // keys per block = 4 vectors
constexpr int64_t kDimChunk = 64;    // value dims per P·V micro-tile = 4 vectors
constexpr int64_t kRowsTarget = 64;  // query rows per work item (all heads of a group × positions)

// The packed keys and values of every (batch, kv head).
struct Packed {
  int64_t D = 0, Dv = 0;  // head_dim, head_dim rounded up to kDimChunk
  int64_t Lk = 0;         // key capacity per (batch, kv head): n_seq rounded up to kKeyBlock
  float* kt = nullptr;    // [B, Hkv][D, Lk]  keys transposed, valid keys first, zero padded
  float* v = nullptr;     // [B, Hkv][Lk, Dv] values of the same keys, zero padded
  const int64_t* n_keys = nullptr;  // [B] valid keys of each batch row
};

// s[MR, 64] = scale · q[MR, 0:D] · kt[0:D, 0:64] (q row stride ldq, kt row stride ldk).
template <int MR>
DC_TARGET_AVX512 void qk_tile(int64_t D, const float* q, int64_t ldq, const float* kt, int64_t ldk, float scale,
                              float* s) {
  __m512 acc[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 b[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) b[v] = _mm512_load_ps(kt + d * ldk + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(q[r * ldq + d]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_store_ps(s + r * kKeyBlock + 16 * v, _mm512_mul_ps(acc[r][v], sc));
}

// o[MR, 64] = o · corr[r] + p[MR, 0:nk] · v[0:nk, 0:64] (p row stride kKeyBlock, v ldv, o ldo).
template <int MR>
DC_TARGET_AVX512 void pv_tile(int64_t nk, const float* p, const float* v, int64_t ldv, const float* corr, float* o,
                              int64_t ldo) {
  __m512 acc[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const __m512 c = _mm512_set1_ps(corr[r]);
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) acc[r][x] = _mm512_mul_ps(_mm512_load_ps(o + r * ldo + 16 * x), c);
  }
  for (int64_t j = 0; j < nk; ++j) {
    __m512 b[4];
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) b[x] = _mm512_load_ps(v + j * ldv + 16 * x);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(p[r * kKeyBlock + j]);
#pragma GCC unroll 4
      for (int x = 0; x < 4; ++x) acc[r][x] = _mm512_fmadd_ps(a, b[x], acc[r][x]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) _mm512_store_ps(o + r * ldo + 16 * x, acc[r][x]);
}

// Online softmax over one key block for rows [0, R): s (scores, [R, 64], nk valid) becomes p = e^(s - m),
// m / l (running max / sum) are updated, corr[r] = e^(m_old - m_new) rescales the row's output.
DC_TARGET_AVX512 void softmax_block(int64_t R, int64_t nk, float* s, float* m, float* l, float* corr) {
  for (int64_t r = 0; r < R; ++r) {
    float* row = s + r * kKeyBlock;
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int v = 0; v < 4; ++v) mx = _mm512_mask_max_ps(mx, mask16(nk - 16 * v), mx, _mm512_load_ps(row + 16 * v));
    const float m_new = std::max(m[r], _mm512_reduce_max_ps(mx));
    corr[r] = std::exp(m[r] - m_new);  // m[r] = -inf on the first block: 0
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int v = 0; v < 4; ++v) {
      const __m512 p =
          _mm512_maskz_mov_ps(mask16(nk - 16 * v), simd::exp_ps(_mm512_sub_ps(_mm512_load_ps(row + 16 * v), mv)));
      _mm512_store_ps(row + 16 * v, p);
      sum = _mm512_add_ps(sum, p);
    }
    l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(sum);
    m[r] = m_new;
  }
}

// Per-item working set: query rows, scores / probabilities, output accumulators, softmax state.
struct Tile {
  float* q;  // [R, D]
  float* s;  // [R, 64]
  float* o;  // [R, Dv]
  float *m, *l, *corr;  // [R] each
};

template <int MR>
void tiles(int64_t r, const Packed& pk, const Tile& t, const float* kt, const float* vv, int64_t nk, float scale,
           bool qk) {
  if (qk) return qk_tile<MR>(pk.D, t.q + r * pk.D, pk.D, kt, pk.Lk, scale, t.s + r * kKeyBlock);
  for (int64_t c = 0; c < pk.Dv; c += kDimChunk)
    pv_tile<MR>(nk, t.s + r * kKeyBlock, vv + c, pk.Dv, t.corr + r, t.o + r * pk.Dv + c, pk.Dv);
}

// Rows [0, R) in micro-tiles of kMr (the last one shorter): Q·Kᵀ when qk, else P·V.
void for_tiles(int64_t R, const Packed& pk, const Tile& t, const float* kt, const float* vv, int64_t nk, float scale,
               bool qk) {
  int64_t r = 0;
  for (; r + kMr <= R; r += kMr) tiles<kMr>(r, pk, t, kt, vv, nk, scale, qk);
  switch (R - r) {
    case 5: return tiles<5>(r, pk, t, kt, vv, nk, scale, qk);
    case 4: return tiles<4>(r, pk, t, kt, vv, nk, scale, qk);
    case 3: return tiles<3>(r, pk, t, kt, vv, nk, scale, qk);
    case 2: return tiles<2>(r, pk, t, kt, vv, nk, scale, qk);
    case 1: return tiles<1>(r, pk, t, kt, vv, nk, scale, qk);
    default: return;
  }
}

// One work item: batch b, kv head hk, window rows [i0, i1) (absolute positions window_begin + i, or
// positions[i]). q, out: [B, W, n_head, head_dim]; valid: [B, L] or nullptr.
// Its buffers are this thread's of ws.
void attend_block(Workspace& ws, const AttentionShape& s, const Packed& pk, int64_t window_begin, const int64_t* positions,
                  int64_t W, const float* q, const uint8_t* valid, int64_t b, int64_t hk, int64_t i0, int64_t i1,
                  float* out) {
  const int64_t L = s.n_seq, H = s.n_head, D = s.head_dim, group = s.n_head / s.n_head_kv;
  const int64_t q_stride = H * D;
  // Query rows: (head h, window row i) for every valid position; invalid positions get zeros.
  struct QueryRow {
    int64_t h, i;
  };
  QueryRow* rows = ws.thread_buffer<QueryRow>("attention.rows", static_cast<size_t>(group * (i1 - i0)));
  int64_t R = 0;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = hk * group + g;
    for (int64_t i = i0; i < i1; ++i) {
      float* o = out + (b * W + i) * q_stride + h * D;
      if (valid && !valid[b * L + (positions != nullptr ? positions[i] : window_begin + i)]) std::fill(o, o + D, 0.0f);
      else rows[R++] = QueryRow{h, i};
    }
  }
  const int64_t nkeys = pk.n_keys[b];
  if (R == 0) return;
  const int64_t q_floats = (R * D + 15) / 16 * 16;  // keeps the next buffers 64-byte aligned
  Tile t;
  t.q = ws.thread_buffer<float>("attention.tile", q_floats + R * (kKeyBlock + pk.Dv + 3));
  t.s = t.q + q_floats;
  t.o = t.s + R * kKeyBlock;
  t.m = t.o + R * pk.Dv;
  t.l = t.m + R;
  t.corr = t.l + R;
  for (int64_t r = 0; r < R; ++r) {
    const auto [h, i] = rows[r];
    std::copy_n(q + (b * W + i) * q_stride + h * D, D, t.q + r * D);
    std::fill(t.o + r * pk.Dv, t.o + (r + 1) * pk.Dv, 0.0f);
    t.m[r] = -std::numeric_limits<float>::infinity();
    t.l[r] = 0;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t bh = b * s.n_head_kv + hk;
  const float* kt = pk.kt + bh * D * pk.Lk;
  const float* vv = pk.v + bh * pk.Lk * pk.Dv;
  for (int64_t j0 = 0; j0 < nkeys; j0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, nkeys - j0);
    for_tiles(R, pk, t, kt + j0, nullptr, nk, scale, true);
    softmax_block(R, nk, t.s, t.m, t.l, t.corr);
    for_tiles(R, pk, t, nullptr, vv + j0 * pk.Dv, nk, scale, false);
  }
  for (int64_t r = 0; r < R; ++r) {
    const auto [h, i] = rows[r];
    const float inv = 1.0f / t.l[r];  // l >= 1: the query itself is a valid key
    float* dst = out + (b * W + i) * q_stride + h * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = t.o[r * pk.Dv + d] * inv;
  }
}

// Packs the valid keys key_pos[0, nk) of (batch b, kv head hk) into slot bh of pk (zero padded).
void pack_kv(const Packed& pk, const float* k, const float* v, int64_t kv_stride, int64_t L, int64_t b, int64_t hk,
             int64_t bh, const int64_t* key_pos, int64_t nk) {
  const int64_t D = pk.D;
  float* kt = pk.kt + bh * D * pk.Lk;
  float* vv = pk.v + bh * pk.Lk * pk.Dv;
  std::fill(kt, kt + D * pk.Lk, 0.0f);
  std::fill(vv, vv + pk.Lk * pk.Dv, 0.0f);
  for (int64_t j = 0; j < nk; ++j) {
    const float* kj = k + (b * L + key_pos[j]) * kv_stride + hk * D;
    for (int64_t d = 0; d < D; ++d) kt[d * pk.Lk + j] = kj[d];
    std::copy_n(v + (b * L + key_pos[j]) * kv_stride + hk * D, D, vv + j * pk.Dv);
  }
}

}  // namespace

// The contract of attention_window (ops/attention_window.h): q, out [B, W, n_head, head_dim]; k, v
// [B, L, n_head_kv, head_dim]; valid [B, L] or nullptr.
void attention_window_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& s, int64_t window_begin,
                           int64_t window_len, const float* q, const float* k, const float* v, const uint8_t* valid,
                           float* out, const int64_t* positions) {
  if (!cpu_has_avx512()) return attention_window(pool, s, window_begin, window_len, q, k, v, valid, out, positions);
  const int64_t B = s.n_batch, L = s.n_seq, Hkv = s.n_head_kv, D = s.head_dim, W = window_len;
  if (B == 0 || W == 0) return;
  const int64_t kv_stride = Hkv * D, group = s.n_head / Hkv;
  Packed pk;
  pk.D = D;
  pk.Dv = (D + kDimChunk - 1) / kDimChunk * kDimChunk;
  pk.Lk = (L + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
  pk.kt = ws.thread_buffer<float>("attention.kv", B * Hkv * pk.Lk * (D + pk.Dv));
  pk.v = pk.kt + B * Hkv * D * pk.Lk;
  int64_t* keys = ws.thread_buffer<int64_t>("attention.keys", B * L);  // valid positions per batch row
  int64_t* n_keys = ws.thread_buffer<int64_t>("attention.n_keys", B);  // their counts
  std::fill_n(n_keys, B, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < L; ++j)
      if (!valid || valid[b * L + j]) keys[b * L + n_keys[b]++] = j;
  pk.n_keys = n_keys;
  const int64_t* key_pos = keys;
  ThreadPool* p = B * L * kv_stride < (1 << 14) ? nullptr : pool;  // tiny: one thread
  parallel_for(p, B * Hkv, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hkv;
      pack_kv(pk, k, v, kv_stride, L, b, bh % Hkv, bh, key_pos + b * L, pk.n_keys[b]);
    }
  });
  // Window positions per work item: about kRowsTarget query rows, fewer when that leaves threads idle
  // (short windows); a row's result does not depend on the split.
  const int64_t n_threads = p ? p->n_threads() : 1;
  const int64_t splits = (n_threads + B * Hkv - 1) / (B * Hkv);  // blocks per (batch, kv head) to fill them
  const int64_t block = std::max<int64_t>(1, std::min(kRowsTarget / group, (W + splits - 1) / splits));
  const int64_t n_blocks = (W + block - 1) / block;
  parallel_for(p, B * Hkv * n_blocks, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t ib = item % n_blocks, bh = item / n_blocks;
      attend_block(ws, s, pk, window_begin, positions, W, q, valid, bh / Hkv, bh % Hkv, ib * block,
                   std::min(W, (ib + 1) * block), out);
    }
  });
}

void attention_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& s, const float* q, const float* k,
                    const float* v, const uint8_t* valid, float* out) {
  if (!cpu_has_avx512()) return attention(pool, s, q, k, v, valid, out);
  attention_window_fast(pool, ws, s, 0, s.n_seq, q, k, v, valid, out, nullptr);
}

}  // namespace dc::cpu
