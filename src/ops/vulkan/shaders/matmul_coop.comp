// y[n, rows] = x[n, cols] · Wᵀ (+ bias[rows]), through epilogue.glsl, on the matrix units (VK_NV_cooperative_matrix, 16×16×16):
// f16 operands (x rounded from f32 and saturated at ±65504; bf16 and f16 weights converted, exactly where
// f16 holds the value), f32 accumulation. A workgroup of 4 subgroups computes a 64 × 128 tile of y (64 rows of x, 128 rows of
// W; subgroup s owns W rows [32 s, 32 s + 32)). Each slice of 64 columns is staged once in shared memory by
// the whole workgroup, f16 packed 4 to a uvec2, while the next slice is already loaded into registers.
// Split-k: workgroup z takes slices [z · p.per_group, (z + 1) · p.per_group) and, when the grid has more
// than one z, writes its partial tile without the bias to part[z] (split_reduce.comp sums them in order
// and applies the bias and the epilogue),
// so that the few-row GEMMs of a cached step fill the GPU.
// kernels.cc calls it for dense f16 / bf16 weights with cols % 64 == 0 on a device with 32-wide subgroups.
#version 450
#extension GL_NV_cooperative_matrix : require
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const int WTYPE = 2;  // weights.glsl's: 1 f16, 2 bf16

layout(std430, binding = 0) readonly buffer X { vec4 x4[]; };      // [n, cols] f32
layout(std430, binding = 1) readonly buffer W { uvec4 w4[]; };     // [rows, cols] 16-bit, row-major
layout(std430, binding = 2) readonly buffer B { float bias[]; };   // [rows]
layout(std430, binding = 3) writeonly buffer Y { float y[]; };     // [n, rows]
layout(std430, binding = 4) writeonly buffer P { float part[]; };  // [splits, n, rows] when split
layout(std430, binding = 5) readonly buffer A { float aux[]; };    // [n, rows] (epilogue.glsl)
layout(push_constant) uniform Push { uint n; uint rows; uint cols; uint has_bias; uint per_group; uint epilogue; } p;

#include "epilogue.glsl"

const uint kBM = 64, kBN = 128, kBK = 64;
// One shared array of uvec2 (4 halves, or 2 floats), used twice: the staged slice (x at 0, W at kW0; rows
// of 72 halves = 18 uvec2: 16-byte aligned, padded against bank conflicts), then the 64 × 32 f32 results
// (rows of 36 floats = 18 uvec2) of two subgroups at a time for the bounds-checked write. 27.6 KB: the
// less shared memory a workgroup takes, the more of them an SM holds.
const uint kSK = 18, kW0 = kBM * kSK, kRS = 18, kOut = kBM * kRS;
shared uvec2 sh[kW0 + kBN * kSK];

#define ACC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define OPERAND fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>

vec4 xr[8];   // the next slice, in registers: x as f32, W as raw 16-bit words
uvec4 wr[8];

void load_slice(uint k0, uint r0, uint c0) {
  const uint t = gl_LocalInvocationID.x;
  for (uint i = 0; i < 8u; ++i) {  // x: 64 rows × 16 vec4; W: 128 rows × 8 uvec4
    const uint v = t + 128u * i, xrow = v / 16u, xq = v % 16u, wrow = v / 8u, wq = v % 8u;
    xr[i] = r0 + xrow < p.n ? x4[((r0 + xrow) * p.cols + k0) / 4u + xq] : vec4(0.0);
    wr[i] = c0 + wrow < p.rows ? w4[((c0 + wrow) * p.cols + k0) / 8u + wq] : uvec4(0u);
  }
}

uint to_f16_pair(uint word) {  // two stored 16-bit weights → two packed f16
  if (WTYPE == 2) return packHalf2x16(vec2(uintBitsToFloat(word << 16), uintBitsToFloat(word & 0xffff0000u)));
  return word;
}

void stage_slice() {
  const uint t = gl_LocalInvocationID.x;
  for (uint i = 0; i < 8u; ++i) {
    const uint v = t + 128u * i, xrow = v / 16u, xq = v % 16u, wrow = v / 8u, wq = v % 8u;
    const vec4 xs = clamp(xr[i], -65504.0, 65504.0);  // beyond f16's range: saturate, never inf
    sh[xrow * kSK + xq] = uvec2(packHalf2x16(xs.xy), packHalf2x16(xs.zw));
    const uint o = kW0 + wrow * kSK + wq * 2u;
    sh[o] = uvec2(to_f16_pair(wr[i].x), to_f16_pair(wr[i].y));
    sh[o + 1u] = uvec2(to_f16_pair(wr[i].z), to_f16_pair(wr[i].w));
  }
}

void main() {
  const uint sg = gl_SubgroupID;
  const uint r0 = gl_WorkGroupID.y * kBM, c0 = gl_WorkGroupID.x * kBN;
  ACC acc[4][2];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = ACC(0.0);
  const uint first = gl_WorkGroupID.z * p.per_group, last = min(first + p.per_group, p.cols / kBK);
  load_slice(first * kBK, r0, c0);
  for (uint s = first; s < last; ++s) {
    barrier();  // the last slice's products have read the staging
    stage_slice();
    barrier();
    if (s + 1u < last) load_slice((s + 1u) * kBK, r0, c0);  // in flight during the products
    for (uint kk = 0; kk < kBK / 4u; kk += 4u) {  // 16 columns = 4 uvec2
      OPERAND a[4], b[2];
      for (int i = 0; i < 4; ++i) coopMatLoadNV(a[i], sh, uint(i) * 16u * kSK + kk, kSK, false);
      for (int j = 0; j < 2; ++j) coopMatLoadNV(b[j], sh, kW0 + (sg * 32u + uint(j) * 16u) * kSK + kk, kSK, true);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
    }
  }
  const bool split = gl_NumWorkGroups.z > 1u;
  const uint part0 = gl_WorkGroupID.z * p.n * p.rows;
  for (uint part_half = 0; part_half < 2u; ++part_half) {  // subgroups 0 and 1, then 2 and 3: 64 columns each
    barrier();  // the staging (or the last half) has been read
    if (sg / 2u == part_half)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 2; ++j) coopMatStoreNV(acc[i][j], sh, (sg % 2u) * kOut + uint(i) * 16u * kRS + uint(j) * 8u, kRS, false);
    barrier();
    for (uint e = gl_LocalInvocationID.x; e < kBM * 64u; e += 128u) {
      const uint row = e / 64u, col = e % 64u, r = r0 + row, c = c0 + part_half * 64u + col;
      if (r >= p.n || c >= p.rows) continue;
      const uvec2 pair = sh[(col / 32u) * kOut + row * kRS + (col % 32u) / 2u];
      const float v = uintBitsToFloat((col & 1u) != 0u ? pair.y : pair.x);
      if (split) part[part0 + r * p.rows + c] = v;
      else y[r * p.rows + c] = epilogue(r * p.rows + c, v + (p.has_bias != 0u ? bias[c] : 0.0));
    }
  }
}
