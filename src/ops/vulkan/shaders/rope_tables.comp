// cos/sin[n, half] of the angles pos[row] · inv_freq[i] (f32 product, as ops/elementwise.h rope_tables).
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer P { int pos[]; };
layout(std430, binding = 1) readonly buffer F { float inv_freq[]; };
layout(std430, binding = 2) writeonly buffer C { float cos_t[]; };
layout(std430, binding = 3) writeonly buffer S { float sin_t[]; };
layout(push_constant) uniform Push { uint n; uint half_dim; } p;

void main() {
  const uint total = p.n * p.half_dim;
  for (uint e = gl_GlobalInvocationID.x; e < total; e += gl_NumWorkGroups.x * 256u) {
    const float angle = float(pos[e / p.half_dim]) * inv_freq[e % p.half_dim];
    cos_t[e] = cos(angle);
    sin_t[e] = sin(angle);
  }
}
