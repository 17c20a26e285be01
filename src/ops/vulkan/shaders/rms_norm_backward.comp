// RMSNorm's backward (ops/elementwise.h rms_norm_backward), with r = rsqrt(mean(x²) + eps) per row:
//   MODE 0: one workgroup per row: rstd[row] = r and, with HAS_DX, dx += r·w·dy − x · r³/d · Σ w·dy·x
//   MODE 1: one invocation per column t: dw[t] += Σ_rows dy·x·r (rows in order; after MODE 0's rstd)
#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const int MODE = 0;
layout(constant_id = 1) const int HAS_DX = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, binding = 3) buffer DX { float dx[]; };
layout(std430, binding = 4) buffer DW { float dw[]; };
layout(std430, binding = 5) buffer R { float rstd[]; };
layout(push_constant) uniform Push { uint n; uint d; float eps; } p;

shared float partial_ss[128], partial_dot[128];

void main() {
  if (MODE == 1) {
    const uint t = gl_GlobalInvocationID.x;
    if (t >= p.d) return;
    float acc = 0.0;
    for (uint i = 0; i < p.n; ++i) acc += dy[i * p.d + t] * x[i * p.d + t] * rstd[i];
    dw[t] += acc;
    return;
  }
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.n) return;
  const uint base = row * p.d;
  float ss = 0.0, dot = 0.0;
  for (uint t = gl_LocalInvocationID.x; t < p.d; t += 128u) {
    const float xv = x[base + t];
    ss = fma(xv, xv, ss);
    dot += w[t] * dy[base + t] * xv;
  }
  ss = subgroupAdd(ss), dot = subgroupAdd(dot);
  if (subgroupElect()) partial_ss[gl_SubgroupID] = ss, partial_dot[gl_SubgroupID] = dot;
  barrier();
  float total = 0.0, total_dot = 0.0;
  for (uint g = 0; g < gl_NumSubgroups; ++g) total += partial_ss[g], total_dot += partial_dot[g];
  const float r = 1.0 / sqrt(total / float(p.d) + p.eps);
  if (gl_LocalInvocationID.x == 0) rstd[row] = r;
  if (HAS_DX == 0) return;
  const float c = total_dot * r * r * r / float(p.d);
  for (uint t = gl_LocalInvocationID.x; t < p.d; t += 128u) dx[base + t] += r * w[t] * dy[base + t] - x[base + t] * c;
}
