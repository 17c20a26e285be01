// In place on x[n, n_heads, head_dim], rotate-half RoPE: x₁' = x₁·cos − x₂·sin, x₂' = x₂·cos + x₁·sin with
// x₁ = x[:half], x₂ = x[half:], cos/sin [n, half]. One invocation per (row, head, i < half). INVERSE
// (specialization constant 0) 1: the rotation by −θ, RoPE's backward (x₁' = x₁·cos + x₂·sin, x₂' = x₂·cos − x₁·sin).
#version 450

layout(local_size_x = 256) in;
layout(constant_id = 0) const int INVERSE = 0;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer C { float cos_t[]; };
layout(std430, binding = 2) readonly buffer S { float sin_t[]; };
layout(push_constant) uniform Push { uint n; uint n_heads; uint half_dim; } p;

void main() {
  const uint total = p.n * p.n_heads * p.half_dim;
  const uint stride = gl_NumWorkGroups.x * 256u;
  for (uint e = gl_GlobalInvocationID.x; e < total; e += stride) {
    const uint i = e % p.half_dim, rh = e / p.half_dim, row = rh / p.n_heads;
    const uint base = rh * 2u * p.half_dim + i;
    const float c = cos_t[row * p.half_dim + i], s = (INVERSE == 1 ? -1.0 : 1.0) * sin_t[row * p.half_dim + i];
    const float x1 = x[base], x2 = x[base + p.half_dim];
    x[base] = x1 * c - x2 * s;
    x[base + p.half_dim] = x2 * c + x1 * s;
  }
}
