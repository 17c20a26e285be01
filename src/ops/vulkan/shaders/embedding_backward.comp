// The embedding's backward, a scatter-add (ops/elementwise.h embedding_backward): dtable[ids[i]] += dy[i]
// for i = 0 .. n−1 in order, one invocation per column (repeated ids never race; the CPU's order).
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer I { uint ids[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) buffer T { float dtable[]; };
layout(push_constant) uniform Push { uint n; uint cols; } p;

void main() {
  for (uint t = gl_GlobalInvocationID.x; t < p.cols; t += gl_NumWorkGroups.x * 256u)
    for (uint i = 0; i < p.n; ++i) dtable[ids[i] * p.cols + t] += dy[i * p.cols + t];
}
