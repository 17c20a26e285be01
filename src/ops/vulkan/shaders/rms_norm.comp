// y[n, d] = x * rsqrt(mean(x²) + eps) * w[d]: one workgroup per row; the sum of squares by subgroup
// reduction, then across subgroups through shared memory. y may alias x.
#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; uint d; float eps; } p;

shared float partial[128];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.n) return;
  const uint base = row * p.d;
  float ss = 0.0;
  for (uint t = gl_LocalInvocationID.x; t < p.d; t += 128u) ss = fma(x[base + t], x[base + t], ss);
  ss = subgroupAdd(ss);
  if (subgroupElect()) partial[gl_SubgroupID] = ss;
  barrier();
  float total = 0.0;
  for (uint g = 0; g < gl_NumSubgroups; ++g) total += partial[g];
  const float r = 1.0 / sqrt(total / float(p.d) + p.eps);
  for (uint t = gl_LocalInvocationID.x; t < p.d; t += 128u) y[base + t] = x[base + t] * r * w[t];
}
