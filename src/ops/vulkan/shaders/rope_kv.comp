// RoPE on the step's q [n, n_head, D] and k [n, n_head_kv, D] in place (rope.comp's arithmetic), and with
// `store` the window's fresh K (rotated) and V into the KV cache at once (kv_store.comp's layout:
// cache[b, window_begin + i, :] for row b · W + i): one pass instead of two RoPE passes and two copies.
// One invocation per (row, head of q then k, i < D/2), then one per float of V when storing. The *_at push
// constants are where the rows start in each buffer (floats): a part's rows in buffers that stack several
// parts (Model::forward_hidden_parts); 0 otherwise.
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Q { float q[]; };                 // [n, n_head, D]
layout(std430, binding = 1) buffer K { float k[]; };                 // [n, n_head_kv, D]
layout(std430, binding = 2) readonly buffer V { float v[]; };        // [n, n_head_kv · D] (store only)
layout(std430, binding = 3) readonly buffer C { float cos_t[]; };    // [n, D/2]
layout(std430, binding = 4) readonly buffer S { float sin_t[]; };    // [n, D/2]
layout(std430, binding = 5) writeonly buffer CK { float cache_k[]; };  // [B, L, n_head_kv · D] (store only)
layout(std430, binding = 6) writeonly buffer CV { float cache_v[]; };  // [B, L, n_head_kv · D] (store only)
layout(push_constant) uniform Push {
  uint n; uint n_head; uint n_head_kv; uint half_dim; uint store; uint W; uint L; uint window_begin;
  uint q_at; uint k_at; uint v_at; uint cos_at; uint sin_at;
} p;

// The cache index of column col of the window's row `row` (= b · W + i).
uint cache_at(uint row, uint col, uint cols) { return ((row / p.W) * p.L + p.window_begin + row % p.W) * cols + col; }

void main() {
  const uint heads = p.n_head + p.n_head_kv, kv_cols = p.n_head_kv * 2u * p.half_dim;
  const uint rope_total = p.n * heads * p.half_dim;
  const uint total = rope_total + (p.store != 0u ? p.n * kv_cols : 0u);
  for (uint e = gl_GlobalInvocationID.x; e < total; e += gl_NumWorkGroups.x * 256u) {
    if (e >= rope_total) {  // V into the cache
      const uint f = e - rope_total;
      cache_v[cache_at(f / kv_cols, f % kv_cols, kv_cols)] = v[p.v_at + f];
      continue;
    }
    const uint i = e % p.half_dim, rh = e / p.half_dim, row = rh / heads, h = rh % heads;
    const float c = cos_t[p.cos_at + row * p.half_dim + i], s = sin_t[p.sin_at + row * p.half_dim + i];
    if (h < p.n_head) {
      const uint base = p.q_at + (row * p.n_head + h) * 2u * p.half_dim + i;
      const float x1 = q[base], x2 = q[base + p.half_dim];
      q[base] = x1 * c - x2 * s;
      q[base + p.half_dim] = x2 * c + x1 * s;
    } else {
      const uint col = (h - p.n_head) * 2u * p.half_dim + i, base = p.k_at + row * kv_cols + col;
      const float x1 = k[base], x2 = k[base + p.half_dim];
      const float r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
      k[base] = r1;
      k[base + p.half_dim] = r2;
      if (p.store != 0u) {
        cache_k[cache_at(row, col, kv_cols)] = r1;
        cache_k[cache_at(row, col + p.half_dim, kv_cols)] = r2;
      }
    }
  }
}
