// out[n, cols] = rows ids[n] of a matrix in its stored layout (weights.glsl: f32, f16, bf16, q8, q4),
// widened to f32: the embedding lookup, and (over an f32 activation) the gather of the out rows.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const int WTYPE = 0;

layout(std430, binding = 0) readonly buffer I { uint ids[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer S { uint scales[]; };
layout(std430, binding = 3) readonly buffer M { uint mins[]; };
layout(std430, binding = 4) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint n; uint cols; uint group_size; } p;

#include "weights.glsl"

void main() {
  const uint count = p.n * p.cols;
  for (uint e = gl_GlobalInvocationID.x; e < count; e += gl_NumWorkGroups.x * 256u) {
    const uint i = e / p.cols, c = e % p.cols;
    o[e] = weight_at(ids[i], c);
  }
}
