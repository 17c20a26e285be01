// Attention's backward (ops/attention.h attention_backward), recomputing the probabilities from q and k
// (nothing but the forward's output is saved): P = softmax(S), S = q·kᵀ·scale over the keys a query attends
// (valid[b, i] && valid[b, j]), δ = rowsum(dout ⊙ out), dS = P ⊙ (dout·vᵀ − δ). Two passes:
//   MODE 0: one invocation per query row (b, i, h): stats[row] = {max S, Σ exp(S − max), δ}, then
//           dq = Σ_j dS_ij · k_j · scale (0 for a row that attends nothing)
//   MODE 1: one invocation per key row (b, j, kv head): over the query heads of its group and every query i,
//           dv_j = Σ P_ij · dout_i, dk_j = Σ dS_ij · q_i · scale (P from MODE 0's stats; 0 for a padded key)
// q, dq, out, dout [B, L, H, HEAD_DIM]; k, v, dk, dv [B, L, Hkv, HEAD_DIM]; valid bytes [B, L] (has_valid).
// (Eight bindings at most: MODE 1 writes dv where MODE 0 reads out.)
#version 450

layout(local_size_x = 64) in;
layout(constant_id = 0) const int HEAD_DIM = 64;
layout(constant_id = 1) const int MODE = 0;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Va { uint valid[]; };
layout(std430, binding = 4) buffer O { float out_or_dv[]; };  // MODE 0: the forward's out (read); MODE 1: dv
layout(std430, binding = 5) readonly buffer DO { float dout[]; };
layout(std430, binding = 6) buffer St { float stats[]; };   // [B, L, H, 3]
layout(std430, binding = 7) writeonly buffer G { float grad[]; };  // MODE 0: dq; MODE 1: dk
layout(push_constant) uniform Push { uint B; uint L; uint H; uint Hkv; uint has_valid; float scale; } p;

bool is_valid(uint b, uint j) {
  if (p.has_valid == 0u) return true;
  const uint e = b * p.L + j;
  return ((valid[e >> 2] >> (8u * (e & 3u))) & 0xffu) != 0u;
}

float dot_rows(uint a_base, uint b_base, int which) {  // which: 0 q·k, 1 dout·v
  float s = 0.0;
  for (int d = 0; d < HEAD_DIM; ++d) s += which == 0 ? q[a_base + d] * k[b_base + d] : dout[a_base + d] * v[b_base + d];
  return s;
}

void query_row(uint row) {  // row = (b·L + i)·H + h
  const uint h = row % p.H, bi = row / p.H, b = bi / p.L, i = bi % p.L, hk = h / (p.H / p.Hkv);
  const uint qb = row * uint(HEAD_DIM);
  float acc[HEAD_DIM];
  for (int d = 0; d < HEAD_DIM; ++d) acc[d] = 0.0;
  float mx = -1.0 / 0.0, sum = 0.0, delta = 0.0;
  if (is_valid(b, i)) {
    for (uint j = 0; j < p.L; ++j)
      if (is_valid(b, j)) mx = max(mx, dot_rows(qb, ((b * p.L + j) * p.Hkv + hk) * uint(HEAD_DIM), 0) * p.scale);
    for (uint j = 0; j < p.L; ++j)
      if (is_valid(b, j)) sum += exp(dot_rows(qb, ((b * p.L + j) * p.Hkv + hk) * uint(HEAD_DIM), 0) * p.scale - mx);
    for (int d = 0; d < HEAD_DIM; ++d) delta += dout[qb + d] * out_or_dv[qb + d];
    for (uint j = 0; j < p.L && sum > 0.0; ++j) {
      if (!is_valid(b, j)) continue;
      const uint kb = ((b * p.L + j) * p.Hkv + hk) * uint(HEAD_DIM);
      const float pj = exp(dot_rows(qb, kb, 0) * p.scale - mx) / sum;
      const float ds = pj * (dot_rows(qb, kb, 1) - delta) * p.scale;
      for (int d = 0; d < HEAD_DIM; ++d) acc[d] += ds * k[kb + d];
    }
  }
  stats[row * 3u] = mx, stats[row * 3u + 1u] = sum, stats[row * 3u + 2u] = delta;
  for (int d = 0; d < HEAD_DIM; ++d) grad[qb + d] = acc[d];
}

void key_row(uint row) {  // row = (b·L + j)·Hkv + hk
  const uint hk = row % p.Hkv, bj = row / p.Hkv, b = bj / p.L, j = bj % p.L, group = p.H / p.Hkv;
  const uint kb = row * uint(HEAD_DIM);
  float dk[HEAD_DIM], dv[HEAD_DIM];
  for (int d = 0; d < HEAD_DIM; ++d) dk[d] = 0.0, dv[d] = 0.0;
  if (is_valid(b, j)) {
    for (uint i = 0; i < p.L; ++i) {
      for (uint g = 0; g < group; ++g) {
        const uint qrow = (b * p.L + i) * p.H + hk * group + g;
        const float sum = stats[qrow * 3u + 1u];
        if (!(sum > 0.0)) continue;  // a padded query, or one that attends nothing
        const uint qb = qrow * uint(HEAD_DIM);
        const float pj = exp(dot_rows(qb, kb, 0) * p.scale - stats[qrow * 3u]) / sum;
        const float ds = pj * (dot_rows(qb, kb, 1) - stats[qrow * 3u + 2u]) * p.scale;
        for (int d = 0; d < HEAD_DIM; ++d) dv[d] += pj * dout[qb + d], dk[d] += ds * q[qb + d];
      }
    }
  }
  for (int d = 0; d < HEAD_DIM; ++d) grad[kb + d] = dk[d], out_or_dv[kb + d] = dv[d];
}

void main() {
  const uint rows = p.B * p.L * (MODE == 0 ? p.H : p.Hkv);
  for (uint row = gl_GlobalInvocationID.x; row < rows; row += gl_NumWorkGroups.x * 64u) {
    if (MODE == 0) query_row(row);
    else key_row(row);
  }
}
