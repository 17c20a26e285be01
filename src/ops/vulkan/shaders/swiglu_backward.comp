// SwiGLU's backward over count floats (ops/elementwise.h swiglu_backward), with s = sigmoid(g):
// dgate = dout·up·s·(1 + g·(1 − s)), dup = dout·g·s. dgate or dup may alias dout (each element is read
// before it is written).
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer G { float gate[]; };
layout(std430, binding = 1) readonly buffer U { float up[]; };
layout(std430, binding = 2) readonly buffer D { float dout[]; };
layout(std430, binding = 3) writeonly buffer DG { float dgate[]; };
layout(std430, binding = 4) writeonly buffer DU { float dup[]; };
layout(push_constant) uniform Push { uint count; } p;

void main() {
  for (uint e = gl_GlobalInvocationID.x; e < p.count; e += gl_NumWorkGroups.x * 256u) {
    const float g = gate[e], u = up[e], d = dout[e];
    const float s = 1.0 / (1.0 + exp(-g));
    dgate[e] = d * u * s * (1.0 + g * (1.0 - s));
    dup[e] = d * g * s;
  }
}
