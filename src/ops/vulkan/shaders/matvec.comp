// y[n, rows] = x[n, cols] · Wᵀ (+ bias), through epilogue.glsl, for few rows of x (n <= 8, the bandwidth-bound case): one workgroup
// per output column reads its weight row once for all n rows; the partial sums meet by subgroup
// reduction, then across subgroups through shared memory.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const int WTYPE = 0;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer S { uint scales[]; };
layout(std430, binding = 3) readonly buffer M { uint mins[]; };
layout(std430, binding = 4) readonly buffer B { float bias[]; };
layout(std430, binding = 5) writeonly buffer Y { float y[]; };
layout(std430, binding = 6) readonly buffer A { float aux[]; };  // epilogue.glsl
layout(push_constant) uniform Push { uint n; uint rows; uint cols; uint group_size; uint has_bias; uint epilogue; } p;

#include "weights.glsl"
#include "epilogue.glsl"

const uint kMaxN = 8;
shared float partial[128][kMaxN];  // one slot per subgroup (at most 128 subgroups of 1)

void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (r >= p.rows) return;  // uniform across the workgroup
  float acc[kMaxN];
  for (uint i = 0; i < kMaxN; ++i) acc[i] = 0.0;
  for (uint c = gl_LocalInvocationID.x; c < p.cols; c += 128u) {
    const float wv = weight_at(r, c);
    for (uint i = 0; i < p.n; ++i) acc[i] = fma(wv, x[i * p.cols + c], acc[i]);
  }
  for (uint i = 0; i < p.n; ++i) {
    const float s = subgroupAdd(acc[i]);
    if (subgroupElect()) partial[gl_SubgroupID][i] = s;
  }
  barrier();
  if (gl_LocalInvocationID.x < p.n) {
    const uint i = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; ++g) s += partial[g][i];
    y[i * p.rows + r] = epilogue(i * p.rows + r, s + (p.has_bias != 0u ? bias[r] : 0.0));
  }
}
