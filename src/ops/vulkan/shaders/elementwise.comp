// Element-wise ops over count floats; OP (specialization constant 0): 0 SwiGLU out = silu(a) · b,
// 1 residual add out = a + b, 2 scale out = s · a (b not read). out may alias a or b (each element is read
// before it is written).
#version 450

layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = 0;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint count; float s; } p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u) {
    const float g = a[e];
    o[e] = OP == 0 ? g / (1.0 + exp(-g)) * b[e] : OP == 1 ? g + b[e] : p.s * g;
  }
}
