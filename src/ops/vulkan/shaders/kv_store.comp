// The window's fresh keys or values into the KV cache: cache[b, window_begin + i, :] = src[b, i, :] for the
// W window positions of each of the B rows (C = n_head_kv · head_dim floats per position).
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer S { float src[]; };     // [B, W, C]
layout(std430, binding = 1) writeonly buffer D { float cache[]; };  // [B, L, C]
layout(push_constant) uniform Push { uint count; uint W; uint L; uint C; uint window_begin; } p;

void main() {
  const uint row = p.W * p.C;  // floats of one batch row's window
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u) {
    const uint b = e / row;
    cache[(b * p.L + p.window_begin) * p.C + e % row] = src[e];
  }
}
