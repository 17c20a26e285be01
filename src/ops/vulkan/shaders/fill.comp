// Word copies and fills over count 32-bit words; OP (specialization constant 0): 0 copy out = a (bit for
// bit: uint words, no float arithmetic), 1 zero out = 0 (a is not read). The training forward's saved
// activations, the backward's zeroed accumulators.
#version 450

layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = 0;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Push { uint count; } p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u) o[e] = OP == 0 ? a[e] : 0u;
}
