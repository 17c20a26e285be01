// dbias[cols] (+)= Σ_rows dy[rows, cols] (matmul_nt_backward's bias gradient), rows in order, one invocation
// per column.
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer DY { float dy[]; };
layout(std430, binding = 1) buffer O { float o[]; };
layout(push_constant) uniform Push { uint rows; uint cols; uint accumulate; } p;

void main() {
  const uint c = gl_GlobalInvocationID.x;
  if (c >= p.cols) return;
  float s = 0.0;
  for (uint r = 0; r < p.rows; ++r) s += dy[r * p.cols + c];
  o[c] = p.accumulate != 0u ? o[c] + s : s;
}
