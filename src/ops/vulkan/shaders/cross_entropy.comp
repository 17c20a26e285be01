// The fused log-softmax + cross-entropy over the loss rows (ops/loss.h cross_entropy), one workgroup per
// row r of logits[n, n_vocab]: lse = max + log Σ exp(x − max), wce[r] = weights[r]·(lse − x[target]), with HAS_CE
// ce[r] = lse − x[target] and, with HAS_DLOGITS, dlogits[r] = weights[r]·(exp(x − lse) − onehot(target)) (dlogits may alias logits:
// the target's logit is read before any write).
#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 128) in;
layout(constant_id = 0) const int HAS_DLOGITS = 1;
layout(constant_id = 1) const int HAS_CE = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer T { uint targets[]; };
layout(std430, binding = 2) readonly buffer Wt { float weights[]; };
layout(std430, binding = 3) buffer G { float g[]; };           // dlogits (may be x's buffer)
layout(std430, binding = 4) writeonly buffer C { float ce[]; };    // [n]
layout(std430, binding = 5) writeonly buffer WC { float wce[]; };  // [n]
layout(push_constant) uniform Push { uint n; uint n_vocab; } p;

shared float partial[128];

// The workgroup's reduction of v (max when is_max, else sum), the same value in every invocation.
float reduce(float v, bool is_max) {
  v = is_max ? subgroupMax(v) : subgroupAdd(v);
  if (subgroupElect()) partial[gl_SubgroupID] = v;
  barrier();
  float r = partial[0];
  for (uint s = 1; s < gl_NumSubgroups; ++s) r = is_max ? max(r, partial[s]) : r + partial[s];
  barrier();
  return r;
}

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.n) return;
  const uint base = row * p.n_vocab, t = targets[row];
  float mx = -1.0 / 0.0;
  for (uint c = gl_LocalInvocationID.x; c < p.n_vocab; c += 128u) mx = max(mx, x[base + c]);
  mx = reduce(mx, true);
  float sum = 0.0;
  for (uint c = gl_LocalInvocationID.x; c < p.n_vocab; c += 128u) sum += exp(x[base + c] - mx);
  sum = reduce(sum, false);
  const float lse = mx + log(sum), target_logit = x[base + t], w = weights[row];
  if (gl_LocalInvocationID.x == 0) {
    if (HAS_CE == 1) ce[row] = lse - target_logit;
    wce[row] = w * (lse - target_logit);
  }
  if (HAS_DLOGITS == 0) return;
  barrier();  // every invocation has read the target's logit
  for (uint c = gl_LocalInvocationID.x; c < p.n_vocab; c += 128u) {
    const float e = exp(x[base + c] - lse);
    g[base + c] = c == t ? w * (e - 1.0) : w * e;
  }
}
