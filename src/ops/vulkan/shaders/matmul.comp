// y[n, rows] = x[n, cols] · Wᵀ (+ bias[rows]), through epilogue.glsl: a 64×64 tile of y per workgroup of 16×16 threads (4×4 each),
// x and W staged through shared memory 16 columns at a time (W converted to f32 as it is staged).
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const int WTYPE = 0;     // weights.glsl

layout(std430, binding = 0) readonly buffer X { float x[]; };       // [n, cols]
layout(std430, binding = 1) readonly buffer W { uint w[]; };        // weights.glsl
layout(std430, binding = 2) readonly buffer S { uint scales[]; };
layout(std430, binding = 3) readonly buffer M { uint mins[]; };
layout(std430, binding = 4) readonly buffer B { float bias[]; };    // [rows]
layout(std430, binding = 5) writeonly buffer Y { float y[]; };      // [n, rows]
layout(std430, binding = 6) readonly buffer A { float aux[]; };     // [n, rows] (epilogue.glsl)
layout(push_constant) uniform Push { uint n; uint rows; uint cols; uint group_size; uint has_bias; uint epilogue; } p;

#include "weights.glsl"
#include "epilogue.glsl"

const uint kTile = 64, kK = 16;
shared float xs[kTile][kK + 1];
shared float ws[kTile][kK + 1];

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, lid = ty * 16u + tx;
  const uint m0 = gl_WorkGroupID.x * kTile, n0 = gl_WorkGroupID.y * kTile;
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
  for (uint k0 = 0; k0 < p.cols; k0 += kK) {
    for (uint l = 0; l < 4u; ++l) {
      const uint idx = lid + 256u * l, row = idx / kK, kk = idx % kK, k = k0 + kk;
      xs[row][kk] = (n0 + row < p.n && k < p.cols) ? x[(n0 + row) * p.cols + k] : 0.0;
      ws[row][kk] = (m0 + row < p.rows && k < p.cols) ? weight_at(m0 + row, k) : 0.0;
    }
    barrier();
    for (uint kk = 0; kk < kK; ++kk) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i) a[i] = xs[ty + 16u * i][kk];
      for (int j = 0; j < 4; ++j) b[j] = ws[tx + 16u * j][kk];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
    barrier();
  }
  for (int i = 0; i < 4; ++i) {
    const uint r = n0 + ty + 16u * i;
    if (r >= p.n) continue;
    for (int j = 0; j < 4; ++j) {
      const uint c = m0 + tx + 16u * j;
      if (c < p.rows) y[r * p.rows + c] = epilogue(r * p.rows + c, acc[i][j] + (p.has_bias != 0u ? bias[c] : 0.0));
    }
  }
}
