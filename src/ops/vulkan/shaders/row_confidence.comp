// The head sampler's per-row primitives over logits [n, V] scaled by inv_temp (the greedy choice under
// temperature): the argmax (lowest id on ties) and, of p = softmax(z), the max probability, the margin
// p₁ − p₂ and Σ p·log(p + 1e-10) (the negative entropy). One workgroup of 256 per row; three passes over
// the row, each reduced through shared memory: (top-1, its id, top-2), Σ exp(z − z₁), Σ p·log(p + 1e-10).
#version 450

layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Z { float logits[]; };
layout(std430, binding = 1) writeonly buffer I { uint ids[]; };    // [n]
layout(std430, binding = 2) writeonly buffer C { float conf[]; };  // [n, 3]: max prob, margin, −entropy
layout(push_constant) uniform Push { uint n; uint V; float inv_temp; } p;

shared float s_top1[256], s_top2[256], s_sum[256];
shared uint s_id[256];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.n) return;
  const uint t = gl_LocalInvocationID.x, base = row * p.V;
  const float ninf = -1.0 / 0.0;
  float top1 = ninf, top2 = ninf;
  uint id = 0xffffffffu;
  for (uint c = t; c < p.V; c += 256u) {  // ascending c: a tie keeps the earlier (lower) id
    const float z = logits[base + c] * p.inv_temp;
    if (z > top1) {
      top2 = top1;
      top1 = z;
      id = c;
    } else {
      top2 = max(top2, z);
    }
  }
  s_top1[t] = top1, s_top2[t] = top2, s_id[t] = id;
  barrier();
  for (uint half_n = 128u; half_n > 0u; half_n >>= 1) {
    if (t < half_n) {
      const float a1 = s_top1[t], b1 = s_top1[t + half_n];
      const uint ai = s_id[t], bi = s_id[t + half_n];
      if (b1 > a1 || (b1 == a1 && bi < ai)) {
        s_top1[t] = b1, s_id[t] = bi, s_top2[t] = max(a1, s_top2[t + half_n]);
      } else {
        s_top2[t] = max(s_top2[t], b1);
      }
    }
    barrier();
  }
  const float z1 = s_top1[0], z2 = s_top2[0];
  float sum = 0.0;
  for (uint c = t; c < p.V; c += 256u) sum += exp(logits[base + c] * p.inv_temp - z1);
  s_sum[t] = sum;
  barrier();
  for (uint half_n = 128u; half_n > 0u; half_n >>= 1) {
    if (t < half_n) s_sum[t] += s_sum[t + half_n];
    barrier();
  }
  const float total = s_sum[0], lse = z1 + log(total);
  barrier();
  float ent = 0.0;
  for (uint c = t; c < p.V; c += 256u) {
    const float pc = exp(logits[base + c] * p.inv_temp - lse);
    ent += pc * log(pc + 1e-10);
  }
  s_sum[t] = ent;
  barrier();
  for (uint half_n = 128u; half_n > 0u; half_n >>= 1) {
    if (t < half_n) s_sum[t] += s_sum[t + half_n];
    barrier();
  }
  if (t == 0u) {
    ids[row] = s_id[0];
    const float p1 = exp(z1 - lse), p2 = z2 > ninf ? exp(z2 - lse) : 0.0;
    conf[row * 3u] = p1;
    conf[row * 3u + 1u] = p1 - p2;
    conf[row * 3u + 2u] = s_sum[0];
  }
}
