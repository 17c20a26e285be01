// Hashed dropout (ops/dropout.h) over x [count / cols, cols]: y = x · scale where the mask keeps (row, col),
// else 0. The mask is the CPU's bit for bit: h = splitmix64(splitmix64(seed ^ row) ^ col) >= threshold, its
// 64-bit arithmetic in pairs of 32-bit words (.x low, .y high; no shaderInt64 needed). y may be x.
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint count; uint cols; uint seed_lo; uint seed_hi; uint thr_lo; uint thr_hi; float scale; } p;

uvec2 add64(uvec2 a, uvec2 b) {
  uint carry;
  const uint lo = uaddCarry(a.x, b.x, carry);
  return uvec2(lo, a.y + b.y + carry);
}
uvec2 mul64(uvec2 a, uvec2 b) {  // the low 64 bits of a · b
  uint hi, lo;
  umulExtended(a.x, b.x, hi, lo);
  return uvec2(lo, hi + a.x * b.y + a.y * b.x);
}
uvec2 xor_shift(uvec2 z, uint s) {  // z ^ (z >> s), 0 < s < 32
  return z ^ uvec2((z.x >> s) | (z.y << (32u - s)), z.y >> s);
}
uvec2 splitmix64(uvec2 v) {  // core/splitmix64.h
  uvec2 z = add64(v, uvec2(0x7F4A7C15u, 0x9E3779B9u));
  z = mul64(xor_shift(z, 30u), uvec2(0x1CE4E5B9u, 0xBF58476Du));
  z = mul64(xor_shift(z, 27u), uvec2(0x133111EBu, 0x94D049BBu));
  return xor_shift(z, 31u);
}

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u) {
    const uint row = e / p.cols, col = e - row * p.cols;
    uvec2 h = splitmix64(uvec2(p.seed_lo ^ row, p.seed_hi));
    h = splitmix64(uvec2(h.x ^ col, h.y));
    const bool keep = h.y > p.thr_hi || (h.y == p.thr_hi && h.x >= p.thr_lo);
    y[e] = keep ? x[e] * p.scale : 0.0;
  }
}
