// Bidirectional GQA attention, flash-style, for a window of queries against every key of the sequence
// (window_begin = 0, W = L: the full forward). A workgroup of ROWS · 8 invocations takes ROWS query rows of
// one (b, h); keys and values pass through shared memory KEYS at a time (ROWS = KEYS = 16, or 8 where the
// device's shared memory is short: kernels.cc attention_tile; 8 × 8 fits head_dim 128 in 12.6 KB of the 16 KiB
// every device has). Per tile, each invocation computes KEYS / 8 of the ROWS × KEYS scores; then invocation
// (query r, lane c < 8) runs the online softmax of row r over the tile (running max m, sum l) and updates
// its slice d ≡ c (mod 8) of the output. Query i of row b attends
// key j iff valid[b, window_begin + i] && valid[b, j]; a query with no key gets 0.
// Split keys (flash-decoding, for windows of few queries): with p.splits > 1, workgroup z = b · splits + s
// takes keys [s · p.keys_per_split, (s + 1) · p.keys_per_split) and writes its unnormalised output, running
// max and sum to part[s] instead of o; attention_combine.comp merges the splits in order.
// The *_at push constants are where the operands start in their buffers (floats; valid_at: bytes): a part's
// rows in buffers that stack several parts (Model::forward_hidden_parts); 0 otherwise.
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
layout(std430, binding = 5) writeonly buffer P { float part[]; }; // [splits, B, W, H, D + 2] when split
layout(push_constant) uniform Push {
  uint W; uint L; uint H; uint Hkv; uint window_begin; uint has_valid; float scale; uint splits; uint keys_per_split;
  uint q_at; uint k_at; uint v_at; uint valid_at; uint o_at;
} p;

const uint kRows = ROWS, kKeys = KEYS, kLanes = 8, kThreads = ROWS * kLanes;
const int kSlice = (D + 7) / 8;  // output dims per invocation
// q and k rows padded to D + 1 floats: in the score loop a subgroup reads several key rows (8 with 16 × 16
// tiles and 32-wide subgroups) and query rows at once, which at a stride of D = 128 would share one bank.
const uint kPad = uint(D) + 1u;
shared float qs[kRows * kPad];
shared float ks[kKeys * kPad];
shared float vs[kKeys * D];
shared float scores[kRows * kKeys];

bool is_valid(uint b, uint j) {
  if (p.has_valid == 0u) return true;
  const uint e = p.valid_at + b * p.L + j;
  return ((valid[e >> 2] >> (8u * (e & 3u))) & 0xffu) != 0u;
}

void main() {
  const uint t = gl_LocalInvocationID.x, h = gl_WorkGroupID.y, b = gl_WorkGroupID.z / p.splits, split = gl_WorkGroupID.z % p.splits;
  const uint key_begin = split * p.keys_per_split, key_end = min(p.L, key_begin + p.keys_per_split);
  const uint i0 = gl_WorkGroupID.x * kRows, hk = h / (p.H / p.Hkv);
  const float ninf = -1.0 / 0.0;
  for (uint e = t; e < kRows * D; e += kThreads) {
    const uint i = i0 + e / D;
    qs[(e / D) * kPad + e % D] = i < p.W ? q[p.q_at + ((b * p.W + i) * p.H + h) * D + e % D] : 0.0;
  }
  const uint r = t / kLanes, lane = t % kLanes, i = i0 + r;
  const bool live = i < p.W && is_valid(b, p.window_begin + i);
  float acc[kSlice];
  for (int s = 0; s < kSlice; ++s) acc[s] = 0.0;
  float m = ninf, l = 0.0;
  for (uint j0 = key_begin; j0 < key_end; j0 += kKeys) {
    for (uint e = t; e < kKeys * D; e += kThreads) {
      const uint j = j0 + e / D, src = ((b * p.L + j) * p.Hkv + hk) * D + e % D;
      ks[(e / D) * kPad + e % D] = j < key_end ? k[p.k_at + src] : 0.0;
      vs[e] = j < key_end ? v[p.v_at + src] : 0.0;
    }
    barrier();
    for (uint u = 0; u < kKeys / kLanes; ++u) {  // KEYS / 8 of the scores [r2][jj]
      const uint e = t * (kKeys / kLanes) + u, r2 = e / kKeys, jj = e % kKeys, j = j0 + jj;
      float dot = ninf;
      if (j < key_end && is_valid(b, j)) {
        // Four independent sums (D is even; an odd pair's second half is 0): the shared loads pipeline
        // instead of waiting on one chain of D fmas.
        vec4 part = vec4(0.0);
        [[dont_unroll]] for (int d = 0; d < D; d += 4) {
          const uint qa = r2 * kPad + uint(d), ka = jj * kPad + uint(d);
          part.x = fma(qs[qa], ks[ka], part.x);
          part.y = fma(qs[qa + 1u], ks[ka + 1u], part.y);
          if (d + 2 < D) {
            part.z = fma(qs[qa + 2u], ks[ka + 2u], part.z);
            part.w = fma(qs[qa + 3u], ks[ka + 3u], part.w);
          }
        }
        dot = ((part.x + part.y) + (part.z + part.w)) * p.scale;
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
  if (i < p.W && p.splits > 1u) {
    const uint n_batch = gl_NumWorkGroups.z / p.splits;
    const uint base = (((split * n_batch + b) * p.W + i) * p.H + h) * uint(D + 2);
    for (int s = 0; s < kSlice; ++s) {
      const uint d = lane + kLanes * uint(s);
      if (d < D) part[base + d] = acc[s];
    }
    if (lane == 0u) part[base + uint(D)] = m, part[base + uint(D) + 1u] = l;
  } else if (i < p.W) {
    const float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (int s = 0; s < kSlice; ++s) {
      const uint d = lane + kLanes * uint(s);
      if (d < D) o[p.o_at + ((b * p.W + i) * p.H + h) * D + d] = acc[s] * inv;
    }
  }
}
