// The split-key attention's partial results merged (attention.comp with p.splits > 1): for each query row
// (b, i, h), M = max_s m_s and o[d] = Σ_s acc_s[d] · e^(m_s − M) / Σ_s l_s · e^(m_s − M), in the order of s;
// a row with no valid key (every m_s = −inf) gets 0, as the unsplit kernel gives it. o_at: where o starts
// in its buffer (floats; attention.comp's).
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer P { float part[]; };  // [splits, rows, D + 2]
layout(std430, binding = 1) writeonly buffer O { float o[]; };    // [rows, D]
layout(push_constant) uniform Push { uint rows; uint D; uint splits; uint o_at; } p;

void main() {
  const uint count = p.rows * p.D, stride = p.rows * (p.D + 2u);
  for (uint e = gl_GlobalInvocationID.x; e < count; e += gl_NumWorkGroups.x * 256u) {
    const uint row = e / p.D, d = e % p.D, base = row * (p.D + 2u);
    float M = -1.0 / 0.0;
    for (uint s = 0; s < p.splits; ++s) M = max(M, part[s * stride + base + p.D]);
    float sum = 0.0, l = 0.0;
    if (M > -1.0 / 0.0) {
      for (uint s = 0; s < p.splits; ++s) {
        const float m = part[s * stride + base + p.D];
        if (m == -1.0 / 0.0) continue;
        const float w = exp(m - M);
        sum = fma(part[s * stride + base + d], w, sum);
        l = fma(part[s * stride + base + p.D + 1u], w, l);
      }
    }
    o[p.o_at + e] = l > 0.0 ? sum / l : 0.0;
  }
}
