// A sum over x[offset, offset + count) in a fixed order (the same result on every run): SQUARE
// (specialization constant 0) 1 sums x², 0 sums x. Pass 1 (groups > 1): workgroup g sums its chunk of `chunk`
// elements into partial[g]; pass 2 (one workgroup, x = the partials): out[out_index] = the total (a single
// pass when one workgroup covers x). Per workgroup each invocation sums a strided share, then a subgroup and a
// shared-memory reduction.
#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;
layout(constant_id = 0) const int SQUARE = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint count; uint chunk; uint offset; uint out_index; } p;

shared float partial[256];

void main() {
  const uint begin = gl_WorkGroupID.x * p.chunk, end = min(p.count, begin + p.chunk);
  float s = 0.0;
  for (uint e = begin + gl_LocalInvocationID.x; e < end; e += 256u) {
    const float v = x[p.offset + e];
    s += SQUARE == 1 ? v * v : v;
  }
  s = subgroupAdd(s);
  if (subgroupElect()) partial[gl_SubgroupID] = s;
  barrier();
  if (gl_LocalInvocationID.x != 0) return;
  float total = 0.0;
  for (uint g = 0; g < gl_NumSubgroups; ++g) total += partial[g];
  o[p.out_index + gl_WorkGroupID.x] = total;
}
