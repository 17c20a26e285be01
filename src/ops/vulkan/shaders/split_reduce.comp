// y[n, rows] = Σ_z part[z, n, rows] (+ bias[rows]), through epilogue.glsl: the partial tiles of a split-k
// matmul_coop summed in the order of z (deterministic).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer P { float part[]; };   // [splits, n · rows]
layout(std430, binding = 1) readonly buffer B { float bias[]; };   // [rows]
layout(std430, binding = 2) writeonly buffer Y { float y[]; };     // [n, rows]
layout(std430, binding = 3) readonly buffer A { float aux[]; };    // [n, rows] (epilogue.glsl)
layout(push_constant) uniform Push { uint count; uint rows; uint splits; uint has_bias; uint epilogue; } p;

#include "epilogue.glsl"

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u) {
    float s = part[e];
    for (uint z = 1; z < p.splits; ++z) s += part[z * p.count + e];
    y[e] = epilogue(e, s + (p.has_bias != 0u ? bias[e % p.rows] : 0.0));
  }
}
