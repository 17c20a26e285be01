// cos/sin[n, half] of the angles pos[row] · inv_freq[i] (f32 product, as ops/elementwise.h rope_tables).
// The angle is first reduced to [-π, π] (three-part Cody-Waite): GLSL's sin and cos are only specified
// there, and a GPU's fast ones (NVIDIA's) lose the low bits of a 4000-radian angle. The first two parts of 2π
// have at most 11 significant bits, so k · part is exact for |k| < 2^13 (angles to ~51000 rad) without
// relying on a fused fma, which Vulkan does not promise; `precise` keeps the order.
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer P { int pos[]; };
layout(std430, binding = 1) readonly buffer F { float inv_freq[]; };
layout(std430, binding = 2) writeonly buffer C { float cos_t[]; };
layout(std430, binding = 3) writeonly buffer S { float sin_t[]; };
layout(push_constant) uniform Push { uint n; uint half_dim; } p;

void main() {
  const uint total = p.n * p.half_dim;
  for (uint e = gl_GlobalInvocationID.x; e < total; e += gl_NumWorkGroups.x * 256u) {
    precise const float angle = float(pos[e / p.half_dim]) * inv_freq[e % p.half_dim];
    const float k = round(angle * 0.15915494309189535);  // angle / 2π
    precise float r = angle - k * 6.28125;                 // 2π = 6.28125
    r = r - k * 0.0019350051879882812;                     //    + 0.0019350051879882812
    r = r - k * 3.019916050561733e-07;                     //    + 3.019916050561733e-07 (to 7e-15)
    // (the products k · part are exact for |k| < 2^13, angles below ~51 000 rad: positions up to ~51k at
    // inv_freq 1; past that the second product rounds, an error of at most one ulp of k · 0.0019)
    cos_t[e] = cos(r);
    sin_t[e] = sin(r);
  }
}
