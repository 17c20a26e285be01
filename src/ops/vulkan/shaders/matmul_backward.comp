// The products of matmul_nt's backward (ops/matmul.h matmul_nt_backward), c[M, N] = a·b or c += a·b over
// k = 0 .. K−1 in f32, a 64×64 tile of c per workgroup of 16×16 threads (4×4 each), a and b staged through
// shared memory 16 k at a time. MODE (specialization constant 1):
//   0 dx = dy·W: a = dy [M = n, K = out] row-major, b = W [K, N = in] read by weights.glsl (any WTYPE)
//   1 dW = dyᵀ·x: a = dyᵀ (dy [K = n, M = out]), b = x [K, N = in] (f32, bound as w with WTYPE 0)
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const int WTYPE = 0;  // weights.glsl
layout(constant_id = 1) const int MODE = 0;

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };  // weights.glsl: b [K, N]
layout(std430, binding = 2) readonly buffer S { uint scales[]; };
layout(std430, binding = 3) readonly buffer Mn { uint mins[]; };
layout(std430, binding = 4) buffer C { float c[]; };          // [M, N]
layout(push_constant) uniform Push { uint m; uint k; uint cols; uint group_size; uint accumulate; } p;  // cols = N

#include "weights.glsl"

const uint kTile = 64, kK = 16;
shared float as_[kTile][kK + 1];
shared float bs[kK][kTile + 1];

float a_at(uint row, uint k) { return MODE == 0 ? a[row * p.k + k] : a[k * p.m + row]; }

void main() {
  const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, lid = ty * 16u + tx;
  const uint n0 = gl_WorkGroupID.x * kTile, m0 = gl_WorkGroupID.y * kTile;
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
  for (uint k0 = 0; k0 < p.k; k0 += kK) {
    for (uint l = 0; l < 4u; ++l) {
      const uint idx = lid + 256u * l;
      // a's tile [64 rows, 16 k]; in MODE 1 consecutive invocations read consecutive rows (dy's columns).
      const uint ar = MODE == 0 ? idx / kK : idx % kTile, ak = MODE == 0 ? idx % kK : idx / kTile;
      as_[ar][ak] = (m0 + ar < p.m && k0 + ak < p.k) ? a_at(m0 + ar, k0 + ak) : 0.0;
      const uint bk = idx / kTile, bc = idx % kTile;
      bs[bk][bc] = (k0 + bk < p.k && n0 + bc < p.cols) ? weight_at(k0 + bk, n0 + bc) : 0.0;
    }
    barrier();
    for (uint kk = 0; kk < kK; ++kk) {
      float av[4], bv[4];
      for (int i = 0; i < 4; ++i) av[i] = as_[ty + 16u * i][kk];
      for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16u * j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    barrier();
  }
  for (int i = 0; i < 4; ++i) {
    const uint row = m0 + ty + 16u * i;
    if (row >= p.m) continue;
    for (int j = 0; j < 4; ++j) {
      const uint col = n0 + tx + 16u * j;
      if (col >= p.cols) continue;
      const uint e = row * p.cols + col;
      c[e] = p.accumulate != 0u ? c[e] + acc[i][j] : acc[i][j];
    }
  }
}
