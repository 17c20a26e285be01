// Bidirectional GQA attention, flash-style, for a window of queries against every key of the sequence
// (window_begin = 0, W = L: the full forward). A workgroup of ROWS · 8 invocations takes ROWS query rows of
// one (b, h); keys and values pass through shared memory KEYS at a time (ROWS = KEYS = 16, or 8 where the
// device's shared memory is short: kernels.cc attention_tile; 8 × 8 fits head_dim 128 in 12.3 KB of the 16 KiB
// every device has). Per tile, each invocation computes KEYS / 8 of the ROWS × KEYS scores; then invocation
// (query r, lane c < 8) runs the online softmax of row r over the tile (running max m, sum l) and updates
// its slice d ≡ c (mod 8) of the output. Query i of row b attends
// key j iff valid[b, window_begin + i] && valid[b, j]; a query with no key gets 0.
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 3) in;             // ROWS · 8
layout(constant_id = 0) const int D = 64;     // head_dim
layout(constant_id = 1) const uint ROWS = 16; // query rows per workgroup
layout(constant_id = 2) const uint KEYS = 16; // keys per tile (a multiple of 8)
layout(std430, binding = 0) readonly buffer Q { float q[]; };     // [B, W, H, D]
layout(std430, binding = 1) readonly buffer K { float k[]; };     // [B, L, Hkv, D]
layout(std430, binding = 2) readonly buffer V { float v[]; };     // [B, L, Hkv, D]
layout(std430, binding = 3) readonly buffer M { uint valid[]; };  // bytes [B, L] (has_valid)
layout(std430, binding = 4) writeonly buffer O { float o[]; };    // [B, W, H, D]
layout(push_constant) uniform Push {
  uint W; uint L; uint H; uint Hkv; uint window_begin; uint has_valid; float scale;
} p;

const uint kRows = ROWS, kKeys = KEYS, kLanes = 8, kThreads = ROWS * kLanes;
const int kSlice = (D + 7) / 8;  // output dims per invocation
shared float qs[kRows * D];
shared float ks[kKeys * D];
shared float vs[kKeys * D];
shared float scores[kRows * kKeys];

bool is_valid(uint b, uint j) {
  if (p.has_valid == 0u) return true;
  const uint e = b * p.L + j;
  return ((valid[e >> 2] >> (8u * (e & 3u))) & 0xffu) != 0u;
}

void main() {
  const uint t = gl_LocalInvocationID.x, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z;
  const uint i0 = gl_WorkGroupID.x * kRows, hk = h / (p.H / p.Hkv);
  const float ninf = -1.0 / 0.0;
  for (uint e = t; e < kRows * D; e += kThreads) {
    const uint i = i0 + e / D;
    qs[e] = i < p.W ? q[((b * p.W + i) * p.H + h) * D + e % D] : 0.0;
  }
  const uint r = t / kLanes, lane = t % kLanes, i = i0 + r;
  const bool live = i < p.W && is_valid(b, p.window_begin + i);
  float acc[kSlice];
  for (int s = 0; s < kSlice; ++s) acc[s] = 0.0;
  float m = ninf, l = 0.0;
  for (uint j0 = 0; j0 < p.L; j0 += kKeys) {
    for (uint e = t; e < kKeys * D; e += kThreads) {
      const uint j = j0 + e / D, src = ((b * p.L + j) * p.Hkv + hk) * D + e % D;
      ks[e] = j < p.L ? k[src] : 0.0;
      vs[e] = j < p.L ? v[src] : 0.0;
    }
    barrier();
    for (uint u = 0; u < kKeys / kLanes; ++u) {  // KEYS / 8 of the scores [r2][jj]
      const uint e = t * (kKeys / kLanes) + u, r2 = e / kKeys, jj = e % kKeys, j = j0 + jj;
      float dot = ninf;
      if (j < p.L && is_valid(b, j)) {
        dot = 0.0;
        [[dont_unroll]] for (int d = 0; d < D; ++d) dot = fma(qs[r2 * D + d], ks[jj * D + d], dot);
        dot *= p.scale;
      }
      scores[e] = dot;
    }
    barrier();
    if (live) {
      float tile_max = ninf;
      for (uint jj = 0; jj < kKeys; ++jj) tile_max = max(tile_max, scores[r * kKeys + jj]);
      if (tile_max > ninf) {
        const float m_new = max(m, tile_max), corr = exp(m - m_new);
        l *= corr;
        for (int s = 0; s < kSlice; ++s) acc[s] *= corr;
        [[dont_unroll]] for (uint jj = 0; jj < kKeys; ++jj) {
          const float pj = exp(scores[r * kKeys + jj] - m_new);  // 0 for a masked key
          l += pj;
          for (int s = 0; s < kSlice; ++s) {
            const uint d = lane + kLanes * uint(s);
            if (d < D) acc[s] = fma(pj, vs[jj * D + d], acc[s]);
          }
        }
        m = m_new;
      }
    }
    barrier();
  }
  if (i < p.W) {
    const float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (int s = 0; s < kSlice; ++s) {
      const uint d = lane + kLanes * uint(s);
      if (d < D) o[((b * p.W + i) * p.H + h) * D + d] = acc[s] * inv;
    }
  }
}
