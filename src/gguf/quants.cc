// ggml block formats: dequantization, the quantizers and the q4 repacking (quants.h).
#include "gguf/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/cpu/gguf_blocks.h"

namespace dc {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Stores the smallest f16 at least v (up) or the largest at most v (down), v finite: the nearest one, or its
// neighbour toward +inf (up) / −inf (down) when the nearest lies on the wrong side of v. Toward +inf a
// positive f16's bits grow and a negative one's shrink; toward −inf the reverse.
void put_f16_bound(uint8_t* p, float v, bool up) {
  uint16_t h = f32_to_f16(v);
  const float r = f16_to_f32(h);
  if (up ? r < v : r > v) {
    const bool negative = (h & 0x8000) != 0;
    h = static_cast<uint16_t>(negative == up ? h - 1 : h + 1);
  }
  std::memcpy(p, &h, 2);
}
void put_f16_at_least(uint8_t* p, float v) { put_f16_bound(p, v, true); }
void put_f16_at_most(uint8_t* p, float v) { put_f16_bound(p, v, false); }

// Code v (< 32) of value j (< 32) of a Q4_0 / Q4_1 / Q5_0 / Q5_1 block: its low 4 bits in the low (j < 16) or
// high nibble of qs[j % 16], its fifth bit in bit j of *qh.
void put_code32(uint8_t* qs, uint32_t* qh, int j, int v) {
  qs[j % 16] |= static_cast<uint8_t>(j < 16 ? v & 0xF : (v & 0xF) << 4);
  *qh |= static_cast<uint32_t>(v >> 4) << j;
}

// Q2_K / Q3_K's 2-bit field of value i (< 256): bits 2j of qs[32h + l] for i = 128h + 32j + l.
void put_two_bits(uint8_t* qs, int i, int v) {
  qs[32 * (i / 128) + i % 32] |= static_cast<uint8_t>((v & 3) << (2 * (i % 128 / 32)));
}

// round(v / step) clamped to [lo, hi]; 0 when the step is 0 (an all-zero sub-block).
int code_of(float v, float step, int lo, int hi) {
  if (step == 0.0f) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(v / step), static_cast<float>(lo), static_cast<float>(hi)));
}

bool f16_finite(uint16_t h) { return (h & 0x7C00) != 0x7C00; }
bool f16_finite_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_finite(h);
}

}  // namespace

bool gguf_row_finite(GgufType type, const uint8_t* row, int64_t n) {
  const GgufTypeInfo info = *gguf_type_info(static_cast<uint32_t>(type));
  for (int64_t b = 0; b < n / info.block; ++b) {
    const uint8_t* p = row + b * info.bytes;
    switch (type) {
      case GgufType::kF32: {
        float v;
        std::memcpy(&v, p, 4);
        if (!std::isfinite(v)) return false;
        break;
      }
      case GgufType::kBF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        if ((h & 0x7F80) == 0x7F80) return false;
        break;
      }
      case GgufType::kF16: case GgufType::kQ8_0: case GgufType::kQ4_0: case GgufType::kQ5_0:
        if (!f16_finite_at(p)) return false;
        break;
      case GgufType::kQ4_K: case GgufType::kQ5_K: case GgufType::kQ4_1: case GgufType::kQ5_1:  // d, dmin / m
        if (!f16_finite_at(p) || !f16_finite_at(p + 2)) return false;
        break;
      case GgufType::kQ2_K:
        if (!f16_finite_at(p + 80) || !f16_finite_at(p + 82)) return false;
        break;
      case GgufType::kQ3_K:
        if (!f16_finite_at(p + 108)) return false;
        break;
      case GgufType::kQ6_K:
        if (!f16_finite_at(p + 208)) return false;
        break;
    }
  }
  return true;
}

void k_quant_scale_min(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void gguf_dequantize(GgufType type, const uint8_t* src, float* dst, int64_t n) {
  const GgufTypeInfo info = *gguf_type_info(static_cast<uint32_t>(type));
  DC_CHECK(n % info.block == 0, "gguf_dequantize: n is not a multiple of the block");
  switch (type) {
    case GgufType::kF32: convert_to_f32(DType::kF32, src, dst, static_cast<size_t>(n)); return;
    case GgufType::kF16: convert_to_f32(DType::kF16, src, dst, static_cast<size_t>(n)); return;
    case GgufType::kBF16: convert_to_f32(DType::kBF16, src, dst, static_cast<size_t>(n)); return;
    default: break;
  }
  cpu::ggml_dequantize(static_cast<cpu::GgmlType>(static_cast<uint32_t>(type)), src, dst, n);  // ops' block formats
}

void quantize_q8_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    put_f16(out, amax / 127.0f);
    const float d = f16_at(out);
    for (int j = 0; j < 32; ++j) {
      const float q = d > 0 ? std::nearbyint(x[j] / d) : 0.0f;
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
    }
  }
}

namespace {

// Q4_0 (half = 8) and Q5_0 (half = 16): d = max|x| / (half − 0.5) rounded up to an f16, so every x / d lies
// in [−(half − 0.5), half − 0.5] and q − half = round(x / d) in [−half, half − 1].
void quantize_x_0(const float* x, uint8_t* out, int64_t n, int half) {
  const bool five = half == 16;
  const int64_t block_bytes = five ? 22 : 18;
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += block_bytes) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    put_f16_at_least(out, amax / (static_cast<float>(half) - 0.5f));
    const float d = f16_at(out);
    uint8_t* qs = out + (five ? 6 : 2);
    std::memset(qs, 0, 16);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) put_code32(qs, &qh, j, code_of(x[j], d, -half, half - 1) + half);
    if (five) std::memcpy(out + 2, &qh, 4);
  }
}

// Q4_1 (levels 15) and Q5_1 (levels 31): m the largest f16 at most min x, d the smallest f16 at least
// (max x − m) / levels, q = round((x − m) / d) in [0, levels].
void quantize_x_1(const float* x, uint8_t* out, int64_t n, int levels) {
  const bool five = levels == 31;
  const int64_t block_bytes = five ? 24 : 20;
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += block_bytes) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    put_f16_at_most(out + 2, lo);
    const float m = f16_at(out + 2);
    put_f16_at_least(out, (hi - m) / static_cast<float>(levels));
    const float d = f16_at(out);
    uint8_t* qs = out + (five ? 8 : 4);
    std::memset(qs, 0, 16);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) put_code32(qs, &qh, j, code_of(x[j] - m, d, 0, levels));
    if (five) std::memcpy(out + 4, &qh, 4);
  }
}

}  // namespace

void quantize_q4_0(const float* x, uint8_t* out, int64_t n) { quantize_x_0(x, out, n, 8); }
void quantize_q5_0(const float* x, uint8_t* out, int64_t n) { quantize_x_0(x, out, n, 16); }
void quantize_q4_1(const float* x, uint8_t* out, int64_t n) { quantize_x_1(x, out, n, 15); }
void quantize_q5_1(const float* x, uint8_t* out, int64_t n) { quantize_x_1(x, out, n, 31); }

namespace {

// The scales of a K-quant with a min (Q2_K, Q4_K, Q5_K): per sub-block s of `size` values the range
// [min(0, min x), max(0, max x)]; m[s] ≤ max_code rounds −min up to a multiple of dmin, then sc[s] ≤ max_code
// rounds the step (max + dmin·m) / levels up to a multiple of d, d and dmin (stored as f16 at d_out and
// dmin_out) the smallest f16 values that let the widest sub-block fit. Every value of sub-block s then lies
// in [−dmin·m, −dmin·m + levels·d·sc].
struct ScaleMin {
  float d, dmin;
  int sc[16], m[16];
};
ScaleMin scale_min_of(const float* x, int n_sub, int size, int max_code, int levels, uint8_t* d_out, uint8_t* dmin_out) {
  ScaleMin r{};
  float hi[16], neg_min[16], max_neg_min = 0;
  for (int s = 0; s < n_sub; ++s) {
    float lo = 0;
    hi[s] = 0;
    for (int l = 0; l < size; ++l) lo = std::min(lo, x[size * s + l]), hi[s] = std::max(hi[s], x[size * s + l]);
    neg_min[s] = -lo;
    max_neg_min = std::max(max_neg_min, neg_min[s]);
  }
  const float codes = static_cast<float>(max_code);
  put_f16_at_least(dmin_out, max_neg_min / codes);
  r.dmin = f16_at(dmin_out);
  float need[16], max_need = 0;
  for (int s = 0; s < n_sub; ++s) {
    r.m[s] = r.dmin > 0 ? std::min(max_code, static_cast<int>(std::ceil(neg_min[s] / r.dmin))) : 0;
    need[s] = (hi[s] + r.dmin * static_cast<float>(r.m[s])) / static_cast<float>(levels);
    max_need = std::max(max_need, need[s]);
  }
  put_f16_at_least(d_out, max_need / codes);
  r.d = f16_at(d_out);
  for (int s = 0; s < n_sub; ++s) r.sc[s] = r.d > 0 ? std::min(max_code, static_cast<int>(std::ceil(need[s] / r.d))) : 0;
  return r;
}

// Q4_K (levels 15, no qh) and Q5_K (levels 31): 8 sub-blocks of 32 with 6-bit scales and mins.
void quantize_k4_k5(const float* x, uint8_t* out, int64_t n, int levels) {
  const bool five = levels == 31;
  const int64_t block_bytes = five ? 176 : 144;
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += block_bytes) {
    const ScaleMin p = scale_min_of(x, 8, 32, 63, levels, out, out + 2);
    uint8_t* scales = out + 4;
    uint8_t* qh = five ? out + 16 : nullptr;
    uint8_t* qs = out + (five ? 48 : 16);
    std::memset(out + 4, 0, static_cast<size_t>(block_bytes - 4));
    for (int s = 0; s < 8; ++s) {
      const int sc = p.sc[s], m = p.m[s];
      if (s < 4) {
        scales[s] = static_cast<uint8_t>(sc);
        scales[s + 4] = static_cast<uint8_t>(m);
      } else {
        scales[s + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
        scales[s - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
        scales[s] |= static_cast<uint8_t>((m >> 4) << 6);
      }
      const float ds = p.d * static_cast<float>(sc), ms = p.dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const int v = code_of(x[32 * s + l] + ms, ds, 0, levels);
        qs[32 * (s / 2) + l] |= static_cast<uint8_t>(s % 2 ? (v & 0xF) << 4 : v & 0xF);
        if (five) qh[l] |= static_cast<uint8_t>((v >> 4) << s);
      }
    }
  }
}

}  // namespace

void quantize_q4_k(const float* x, uint8_t* out, int64_t n) { quantize_k4_k5(x, out, n, 15); }
void quantize_q5_k(const float* x, uint8_t* out, int64_t n) { quantize_k4_k5(x, out, n, 31); }

void quantize_q2_k(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += 84) {
    std::memset(out, 0, 80);
    const ScaleMin p = scale_min_of(x, 16, 16, 15, 3, out + 80, out + 82);
    for (int s = 0; s < 16; ++s) out[s] = static_cast<uint8_t>(p.sc[s] | p.m[s] << 4);
    for (int i = 0; i < 256; ++i) {
      const float ds = p.d * static_cast<float>(p.sc[i / 16]), ms = p.dmin * static_cast<float>(p.m[i / 16]);
      put_two_bits(out + 16, i, code_of(x[i] + ms, ds, 0, 3));
    }
  }
}

void quantize_q3_k(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += 110) {
    // Per 16-value sub-block (largest value P ≥ 0, most negative −N ≤ 0) the signed step t with the smallest
    // |t| that maps it into [−4, 3.5]: max(P / 3.5, N / 4), or −max(P / 4, N / 3.5) when that is smaller
    // (the scale is signed, so code −4 can serve either side).
    float need[16], max_need = 0;
    for (int s = 0; s < 16; ++s) {
      float pos = 0, neg = 0;
      for (int l = 0; l < 16; ++l) pos = std::max(pos, x[16 * s + l]), neg = std::max(neg, -x[16 * s + l]);
      const float up = std::max(pos / 3.5f, neg / 4.0f), down = std::max(pos / 4.0f, neg / 3.5f);
      need[s] = up <= down ? up : -down;
      max_need = std::max(max_need, std::fabs(need[s]));
    }
    put_f16_at_least(out + 108, max_need / 31.0f);
    const float d = f16_at(out + 108);
    std::memset(out, 0, 108);
    uint8_t* scales = out + 96;
    int sc[16];  // 6-bit: sc − 32 in [−31, 31]
    for (int s = 0; s < 16; ++s) {
      const int mag = d > 0 ? std::min(31, static_cast<int>(std::ceil(std::fabs(need[s]) / d))) : 0;
      sc[s] = 32 + (need[s] < 0 ? -mag : mag);
      scales[s % 8] |= static_cast<uint8_t>((sc[s] & 0xF) << (s < 8 ? 0 : 4));
      scales[8 + s % 4] |= static_cast<uint8_t>((sc[s] >> 4) << (2 * (s / 4)));
    }
    for (int i = 0; i < 256; ++i) {
      const int v = code_of(x[i], d * static_cast<float>(sc[i / 16] - 32), -4, 3) + 4;  // [0, 7]
      put_two_bits(out + 32, i, v);
      out[i % 32] |= static_cast<uint8_t>((v >> 2) << (4 * (i / 128) + i % 128 / 32));  // hmask: the third bit
    }
  }
}

void quantize_q6_k(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += 210) {
    // Per 16-value sub-block the step amax / 31 (so q in [−31, 31]); its int8 scale rounds up to a
    // multiple of d, the smallest f16 that lets the largest sub-block fit in 127.
    float need[16], max_need = 0;
    for (int s = 0; s < 16; ++s) {
      float amax = 0;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * s + l]));
      need[s] = amax / 31.0f;
      max_need = std::max(max_need, need[s]);
    }
    put_f16_at_least(out + 208, max_need / 127.0f);
    const float d = f16_at(out + 208);
    uint8_t* ql = out;
    uint8_t* qh = out + 128;
    int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
    std::memset(out, 0, 208);
    for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(d > 0 ? std::min(127, static_cast<int>(std::ceil(need[s] / d))) : 0);
    for (int i = 0; i < 256; ++i) {
      // Value i: half h = i / 128; within it, j = i % 128 in quarter g = j / 32 at l = j % 32 (dequant_q6_k).
      const int h = i / 128, g = (i % 128) / 32, l = i % 32;
      const float step = d * static_cast<float>(sc[i / 16]);
      const float q = step > 0 ? std::nearbyint(x[i] / step) : 0.0f;
      const int v = static_cast<int>(std::clamp(q, -32.0f, 31.0f)) + 32;
      uint8_t& low = ql[64 * h + l + (g % 2 ? 32 : 0)];
      low |= static_cast<uint8_t>(g < 2 ? v & 0xF : (v & 0xF) << 4);
      qh[32 * h + l] |= static_cast<uint8_t>((v >> 4) << (2 * g));
    }
  }
}

}  // namespace dc
