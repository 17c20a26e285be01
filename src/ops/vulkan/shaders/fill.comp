// Word copies and fills over count 32-bit words; OP (specialization constant 0): 0 copy o[o_offset + e] =
// a[a_offset + e] (bit for bit: uint words, no float arithmetic), 1 zero o[o_offset + e] = 0 (a is not read).
// The training forward's saved activations, the backward's zeroed accumulators, the loss rows' chunks.
#version 450

layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = 0;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Push { uint count; uint a_offset; uint o_offset; } p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u)
    o[p.o_offset + e] = OP == 0 ? a[p.a_offset + e] : 0u;
}
