// AdamW over flat f32 buffers (ops/adamw.h adamw_value's arithmetic in its order, `precise`: no fused
// multiply-adds), one value per invocation, grid-stride. With has_sumsq (sumsq[0] = Σ g² over every gradient):
// a non-finite Σ skips the update (OptimizerCore's rule: nothing is written), else grad_scale is clip_grad_norm's
// coefficient computed here (train/optimizer.h clip_coefficient): max_norm / (√Σ + 1e-6) when max_norm > 0 and
// it is below 1, else 1 — so the norm never crosses to the host before the update.
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer P { float param[]; };
layout(std430, binding = 1) readonly buffer G { float grad[]; };
layout(std430, binding = 2) buffer M { float m1[]; };
layout(std430, binding = 3) buffer V { float m2[]; };
layout(std430, binding = 4) readonly buffer S { float sumsq[]; };
layout(push_constant) uniform Push {
  uint n; uint has_sumsq; float max_norm;
  float decay; float b1; float b2; float one_b1; float one_b2; float step_size; float bc2_sqrt; float eps; float grad_scale;
} p;

void main() {
  float scale = p.grad_scale;
  if (p.has_sumsq != 0u) {
    const float sum = sumsq[0];
    if (isnan(sum) || isinf(sum)) return;
    precise const float coef = p.max_norm / (sqrt(sum) + 1e-6);
    scale = p.max_norm <= 0.0 || coef >= 1.0 ? 1.0 : coef;
  }
  for (uint e = gl_GlobalInvocationID.x; e < p.n; e += gl_NumWorkGroups.x * 256u) {
    precise float g = grad[e] * scale;
    precise float w = param[e] * p.decay;
    precise float m = m1[e] * p.b1 + g * p.one_b1;
    precise float v = m2[e] * p.b2 + p.one_b2 * g * g;
    precise float denom = sqrt(v) / p.bc2_sqrt + p.eps;
    w += -p.step_size * (m / denom);
    param[e] = w, m1[e] = m, m2[e] = v;
  }
}
