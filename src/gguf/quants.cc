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

// Stores the smallest f16 at least v (v ≥ 0, finite): the nearest one, or the next when that is below v.
void put_f16_at_least(uint8_t* p, float v) {
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) ++h;
  std::memcpy(p, &h, 2);
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

void quantize_q4_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 18) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    put_f16_at_least(out, amax / 7.5f);  // every x / d within [−7.5, 7.5]: q − 8 in [−8, 7] after rounding
    const float d = f16_at(out);
    std::memset(out + 2, 0, 16);
    for (int j = 0; j < 32; ++j) {
      const float q = d > 0 ? std::nearbyint(x[j] / d) : 0.0f;
      const uint8_t v = static_cast<uint8_t>(std::clamp(q, -8.0f, 7.0f) + 8.0f);
      out[2 + j % 16] |= static_cast<uint8_t>(j < 16 ? v : v << 4);
    }
  }
}

namespace {

// Q4_K (levels 15, qh null) and Q5_K (levels 31): per 32-value sub-block the range [min(0, min x),
// max(0, max x)]; m rounds up so that −dmin·m ≤ the sub-block's minimum, then sc rounds up so that the
// levels reach its maximum; d and dmin are f16 values at least as large as the 6-bit codes need.
void quantize_k4_k5(const float* x, uint8_t* out, int64_t n, int levels) {
  const bool five = levels == 31;
  const int64_t block_bytes = five ? 176 : 144;
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += block_bytes) {
    float hi[8], neg_min[8];
    float max_neg_min = 0;
    for (int s = 0; s < 8; ++s) {
      float lo = 0;
      hi[s] = 0;
      for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * s + l]), hi[s] = std::max(hi[s], x[32 * s + l]);
      neg_min[s] = -lo;
      max_neg_min = std::max(max_neg_min, neg_min[s]);
    }
    put_f16_at_least(out + 2, max_neg_min / 63.0f);
    const float dmin = f16_at(out + 2);
    int m[8];
    float need[8], max_need = 0;
    for (int s = 0; s < 8; ++s) {
      m[s] = dmin > 0 ? std::min(63, static_cast<int>(std::ceil(neg_min[s] / dmin))) : 0;
      need[s] = (hi[s] + dmin * static_cast<float>(m[s])) / static_cast<float>(levels);
      max_need = std::max(max_need, need[s]);
    }
    put_f16_at_least(out, max_need / 63.0f);
    const float d = f16_at(out);
    uint8_t* scales = out + 4;
    uint8_t* qh = five ? out + 16 : nullptr;
    uint8_t* qs = out + (five ? 48 : 16);
    std::memset(out + 4, 0, static_cast<size_t>(block_bytes - 4));
    for (int s = 0; s < 8; ++s) {
      const int sc = d > 0 ? std::min(63, static_cast<int>(std::ceil(need[s] / d))) : 0;
      if (s < 4) {
        scales[s] = static_cast<uint8_t>(sc);
        scales[s + 4] = static_cast<uint8_t>(m[s]);
      } else {
        scales[s + 4] = static_cast<uint8_t>((sc & 0xF) | ((m[s] & 0xF) << 4));
        scales[s - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
        scales[s] |= static_cast<uint8_t>((m[s] >> 4) << 6);
      }
      const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m[s]);
      for (int l = 0; l < 32; ++l) {
        const float q = ds > 0 ? std::nearbyint((x[32 * s + l] + ms) / ds) : 0.0f;
        const int v = static_cast<int>(std::clamp(q, 0.0f, static_cast<float>(levels)));
        qs[32 * (s / 2) + l] |= static_cast<uint8_t>(s % 2 ? (v & 0xF) << 4 : v & 0xF);
        if (five) qh[l] |= static_cast<uint8_t>((v >> 4) << s);
      }
    }
  }
}

}  // namespace

void quantize_q4_k(const float* x, uint8_t* out, int64_t n) { quantize_k4_k5(x, out, n, 15); }
void quantize_q5_k(const float* x, uint8_t* out, int64_t n) { quantize_k4_k5(x, out, n, 31); }

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
