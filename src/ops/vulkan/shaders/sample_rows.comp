// The head sampler's step per row of logits [n, V] (sampler/filters.h sample_token, whose rules it follows):
// z = logit / temperature (temperature 0: greedy, no division), top-p then top-k (survivors: a prefix of
// the order "larger z first, equal z lower id first"), p = softmax over the survivors, then the token —
// the argmax (lowest id on ties) when greedy, else the categorical draw of the host's uniform u[row] in the
// CPU's order (the survivors' sorted order when a filter is on, id order when none is) — and of p the
// chosen token's probability, the top-1 − top-2 margin and Σ p·log(p + 1e-10). One workgroup of THREADS
// per row (on a GPU 1024 where it allows, on a CPU device 256 or more as V needs: kernels.cc); ids[row] and conf[row, 3] are all that is written
// (conf NaN: a NaN or +inf z, or every z −inf).
// Prefix cuts (top-p's crossing token, the draw) are searched bit by bit over a monotone uint key of z
// (the largest key K whose mass "key >= K" exceeds the target), then, among the tokens tied at K, by id:
// each probe is one reduction over the row, so no row is ever sorted or sent to the host. At most
// 109 + 2·bit_width(V) passes over the row (top-k's search 32; top-p's cut and the draw 36 + bit_width(V) each;
// 5 more): kernels.cc sizes THREADS on a CPU device from it (llvmpipe ends all loops after 65535 iterations).
#version 450

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint THREADS = 256;  // a power of two
layout(std430, binding = 0) readonly buffer Z { float logits[]; };
layout(std430, binding = 1) readonly buffer U { float uniforms[]; };  // [n]: the draw's u in [0, 1)
layout(std430, binding = 2) writeonly buffer I { uint ids[]; };       // [n]
layout(std430, binding = 3) writeonly buffer C { float conf[]; };     // [n, 3]: max prob, margin, −entropy
// top_k: 0 = off (the host passes 0 for top_k >= V); top_p >= 1 or V == 1: off. at_*: where row 0 of each
// operand starts in its buffer, in elements (a part's rows of a merged step; 0 otherwise).
layout(push_constant) uniform Push { uint n; uint V; float temperature; float top_p; uint top_k; uint at_z; uint at_u; uint at_ids; uint at_conf; } p;

const float kNegInf = -1.0 / 0.0;
const uint kAll = 0xffffffffu;

shared float s_f[THREADS], s_top2[THREADS];
shared uint s_u[THREADS];

uint t, base;
// The survivors: key >= k_min (top-k) and (key > p_key or key == p_key and id <= p_id) (top-p).
uint k_min = 0u, p_key = 0u, p_id = kAll;

float z_at(uint c) {
  float z = logits[base + c];
  if (p.temperature > 0.0) z = z / p.temperature;
  return z == 0.0 ? 0.0 : z;  // −0 and +0 are one value (a tie), as the CPU compares them
}
// Monotone in z: a < b ⇔ key(a) < key(b) (no NaN here).
uint key_of(float z) {
  const uint b = floatBitsToUint(z);
  return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}
float z_of(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? k & 0x7fffffffu : ~k); }
float e_of(float z, float z_max) { return z == kNegInf ? 0.0 : exp(z - z_max); }
bool survives(uint c, uint k) { return k >= k_min && (k > p_key || (k == p_key && c <= p_id)); }

float sum_all(float v) {
  barrier();  // every thread has read the last result
  s_f[t] = v;
  barrier();
  for (uint h = THREADS / 2u; h > 0u; h >>= 1) {
    if (t < h) s_f[t] += s_f[t + h];
    barrier();
  }
  return s_f[0];
}
uint count_all(uint v) {
  barrier();
  s_u[t] = v;
  barrier();
  for (uint h = THREADS / 2u; h > 0u; h >>= 1) {
    if (t < h) s_u[t] += s_u[t + h];
    barrier();
  }
  return s_u[0];
}

// Σ e(z)/z_sum and the count over the survivors with key in [lo, hi] and id < id_end.
float mass(uint lo, uint hi, uint id_end, float z_max, float z_sum) {
  float m = 0.0;
  for (uint c = t; c < p.V; c += THREADS) {
    const float z = z_at(c);
    const uint k = key_of(z);
    if (k >= lo && k <= hi && c < id_end && survives(c, k)) m += e_of(z, z_max) / z_sum;
  }
  return sum_all(m);
}
uint count(uint lo, uint hi, uint id_end) {
  uint m = 0u;
  for (uint c = t; c < p.V; c += THREADS) {
    const uint k = key_of(z_at(c));
    if (k >= lo && k <= hi && c < id_end && survives(c, k)) ++m;
  }
  return count_all(m);
}

// The largest id B < 2^bits with count(key == k, id < B) < r: the r-th lowest id of the tokens at key k.
uint rth_id(uint k, uint r) {
  uint b = 0u;
  for (int bit = findMSB(p.V); bit >= 0; --bit) {
    const uint cand = b | (1u << uint(bit));
    if (count(k, k, cand) < r) b = cand;
  }
  return b;
}

// The sorted-order prefix cut: the first token (larger z first, ties lower id first) at which the running
// Σ of p over the survivors exceeds `target` → (its key, its id) in out_key / out_id. When none does (top-p
// above the whole mass): out_key 0, out_id kAll (everything kept).
void sorted_cut(float target, float z_max, float z_sum, out uint out_key, out uint out_id) {
  out_key = 0u, out_id = kAll;
  if (!(mass(0u, kAll, kAll, z_max, z_sum) > target)) return;
  uint k = 0u;
  for (int bit = 31; bit >= 0; --bit) {
    const uint cand = k | (1u << uint(bit));
    if (mass(cand, kAll, kAll, z_max, z_sum) > target) k = cand;
  }
  // The tokens tied at k, in id order, each adding the same p to the mass above k: the running sum after r
  // of them rounded once (fma), as the CPU's f64 sum rounded to f32 is. r = the fewest (1 <= r <= tied) whose
  // sum exceeds target, else tied: a binary search (the sum is monotone in r; a tie group can hold all of V).
  const float above = mass(k + 1u, kAll, kAll, z_max, z_sum), pk = e_of(z_of(k), z_max) / z_sum;
  const uint tied = count(k, k, kAll);
  uint r = 1u, r_hi = tied;
  while (r < r_hi) {
    const uint mid = r + (r_hi - r) / 2u;
    if (fma(float(mid), pk, above) > target) r_hi = mid;
    else r = mid + 1u;
  }
  out_key = k;
  out_id = r == tied ? kAll : rth_id(k, r);
}

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  if (row >= p.n) return;
  t = gl_LocalInvocationID.x;
  base = p.at_z + row * p.V;

  // Top-1 (its id), top-2 (with multiplicity) and a NaN / +inf check.
  float top1 = kNegInf, top2 = kNegInf;
  uint id = kAll, bad = 0u;
  for (uint c = t; c < p.V; c += THREADS) {  // ascending c: a tie keeps the earlier (lower) id
    const float z = z_at(c);
    if (isnan(z) || (isinf(z) && z > 0.0)) bad = 1u;
    if (z > top1) {
      top2 = top1;
      top1 = z;
      id = c;
    } else {
      top2 = max(top2, z);
    }
  }
  s_f[t] = top1, s_top2[t] = top2, s_u[t] = id;
  barrier();
  for (uint h = THREADS / 2u; h > 0u; h >>= 1) {
    if (t < h) {
      const float a1 = s_f[t], b1 = s_f[t + h];
      const uint ai = s_u[t], bi = s_u[t + h];
      if (b1 > a1 || (b1 == a1 && bi < ai)) {
        s_f[t] = b1, s_u[t] = bi, s_top2[t] = max(a1, s_top2[t + h]);
      } else {
        s_top2[t] = max(s_top2[t], b1);
      }
    }
    barrier();
  }
  const float z_max = s_f[0], z_2 = s_top2[0];
  const uint top_id = s_u[0];
  if (count_all(bad) != 0u || z_max == kNegInf) {
    if (t == 0u) {
      const float nan = uintBitsToFloat(0x7fc00000u);
      ids[p.at_ids + row] = 0u;
      conf[p.at_conf + row * 3u] = nan;
      conf[p.at_conf + row * 3u + 1u] = nan;
      conf[p.at_conf + row * 3u + 2u] = nan;
    }
    return;
  }

  // Top-k: the largest key with at least top_k tokens at or above it (ties at the threshold all kept).
  uint k_threshold = 0u;
  if (p.top_k > 0u) {
    for (int bit = 31; bit >= 0; --bit) {
      const uint cand = k_threshold | (1u << uint(bit));
      if (count(cand, kAll, kAll) >= p.top_k) k_threshold = cand;
    }
  }
  // Top-p over every token (softmax of the whole row), the crossing token kept.
  if (p.top_p < 1.0 && p.V > 1u) {
    const float z_all = mass(0u, kAll, kAll, z_max, 1.0);  // Σ e over every token
    uint pk, pi;
    sorted_cut(p.top_p, z_max, z_all, pk, pi);
    p_key = pk, p_id = pi;
  }
  k_min = k_threshold;

  const float z_sum = mass(0u, kAll, kAll, z_max, 1.0);  // Σ e over the survivors: p = e / z_sum
  const uint n_surv = count(0u, kAll, kAll);
  uint chosen = top_id;
  if (p.temperature > 0.0) {
    const float total = mass(0u, kAll, kAll, z_max, z_sum);
    // u < 1 (the host clamps it) keeps the target below total, so some token crosses it.
    const float target = uniforms[p.at_u + row] * total;
    if (p.top_k > 0u || (p.top_p < 1.0 && p.V > 1u)) {
      uint ck, ci;
      sorted_cut(target, z_max, z_sum, ck, ci);
      // ci is kAll when the whole tie group at ck is needed: its last id.
      chosen = ci != kAll ? ci : rth_id(ck, count(ck, ck, kAll));
    } else {  // id order: the largest B with Σ_{id < B} p <= target
      uint b = 0u;
      for (int bit = findMSB(p.V); bit >= 0; --bit) {
        const uint cand = b | (1u << uint(bit));
        if (cand <= p.V && !(mass(0u, kAll, cand, z_max, z_sum) > target)) b = cand;
      }
      chosen = b;
    }
  }
  float ent = 0.0;
  for (uint c = t; c < p.V; c += THREADS) {
    const float z = z_at(c);
    if (survives(c, key_of(z))) {
      const float pc = e_of(z, z_max) / z_sum;
      ent += pc * log(pc + 1e-10);
    }
  }
  ent = sum_all(ent);
  if (t == 0u) {
    ids[p.at_ids + row] = chosen;
    const float p1 = 1.0 / z_sum, p2 = n_surv >= 2u ? e_of(z_2, z_max) / z_sum : 0.0;
    conf[p.at_conf + row * 3u] = e_of(z_at(chosen), z_max) / z_sum;
    conf[p.at_conf + row * 3u + 1u] = p1 - p2;
    conf[p.at_conf + row * 3u + 2u] = ent;
  }
}
