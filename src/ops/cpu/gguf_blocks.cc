// ggml block formats: block sizes, dequantization (as ggml computes it) and the decoded u8 form the fast
// kernel reads (gguf_blocks.h).
#include "ops/cpu/gguf_blocks.h"

#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace dc::cpu {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K's 12 packed bytes.
void k4_scale_min(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K's 6-bit scale s (0..63) of 16-value sub-block i (0..15): low 4 bits in the nibbles of bytes 0..7,
// high 2 bits in bytes 8..11.
int q3_scale(const uint8_t* s, int i) {
  const int low = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return low | high << 4;
}

// The unsigned code of each value of one block (`values` of them) into u[], and per 16 values the
// integer factor pair the scale and offset are built from (see decode_block).
// Q4_0 / Q4_1 / Q5_0 / Q5_1 share the nibble layout: value j low nibble of qs[j], j+16 the high one.
void nibbles32(const uint8_t* qs, uint32_t qh, bool five, uint8_t* u) {
  for (int j = 0; j < 16; ++j) {
    u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (five ? ((qh >> j) & 1) << 4 : 0));
    u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0));
  }
}

// Q2_K / Q3_K's 2-bit codes: value 128h + 32j + l at bits 2j of qs[32h + l].
int two_bits(const uint8_t* qs, int i) { return (qs[32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3; }

// Q3_K's third bit of value i.
int q3_high(const uint8_t* hmask, int i) { return (hmask[i % 32] >> (4 * (i / 128) + i % 128 / 32)) & 1; }

// Q4_K / Q5_K code of value i (sub-block s = i / 32: low nibbles of qs[32·(s/2)..] for even s).
int k45_code(const uint8_t* qs, const uint8_t* qh, int i) {
  const int s = i / 32, l = i % 32;
  int v = s % 2 ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 0xF;
  if (qh != nullptr) v |= ((qh[l] >> s) & 1) << 4;
  return v;
}

// Q6_K code (0..63) of value i: half h = i / 128, quarter g, position l (ggml's dequantize_row_q6_K).
int q6_code(const uint8_t* b, int i) {
  const int h = i / 128, g = i % 128 / 32, l = i % 32;
  const uint8_t* ql = b + 64 * h;
  const uint8_t* qh = b + 128 + 32 * h;
  const int low = (g % 2 ? ql[l + 32] : ql[l]) >> (g < 2 ? 0 : 4) & 0xF;
  return low | ((qh[l] >> (2 * g)) & 3) << 4;
}

void dequantize_block(GgmlType t, const uint8_t* b, float* y) {
  switch (t) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ4_1: case GgmlType::kQ5_1: {
      const bool five = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1, with_m = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
      const float d = f16_at(b), m = with_m ? f16_at(b + 2) : 0.0f;
      const uint8_t* after = b + (with_m ? 4 : 2);
      uint8_t u[32];
      nibbles32(after + (five ? 4 : 0), five ? u32_at(after) : 0, five, u);
      const int bias = with_m ? 0 : five ? 16 : 8;
      for (int j = 0; j < 32; ++j) y[j] = with_m ? static_cast<float>(u[j]) * d + m : static_cast<float>(u[j] - bias) * d;
      return;
    }
    case GgmlType::kQ8_0: {
      const float d = f16_at(b);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      return;
    }
    case GgmlType::kQ2_K: {
      const float d = f16_at(b + 80), dmin = f16_at(b + 82);
      for (int i = 0; i < 256; ++i) {
        const int sc = b[i / 16];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        y[i] = dl * static_cast<float>(two_bits(b + 16, i)) - ml;
      }
      return;
    }
    case GgmlType::kQ3_K: {
      const float d = f16_at(b + 108);
      for (int i = 0; i < 256; ++i) {
        const float dl = d * static_cast<float>(q3_scale(b + 96, i / 16) - 32);
        y[i] = dl * static_cast<float>(two_bits(b + 32, i) - (q3_high(b, i) ? 0 : 4));
      }
      return;
    }
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: {
      const bool five = t == GgmlType::kQ5_K;
      const float d = f16_at(b), dmin = f16_at(b + 2);
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        k4_scale_min(b + 4, s, &sc, &m);
        const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l)
          y[32 * s + l] = ds * static_cast<float>(k45_code(b + (five ? 48 : 16), five ? b + 16 : nullptr, 32 * s + l)) - ms;
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const float d = f16_at(b + 208);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int i = 0; i < 256; ++i) y[i] = d * static_cast<float>(sc[i / 16]) * static_cast<float>(q6_code(b, i) - 32);
      return;
    }
    case GgmlType::kNone: break;
  }
  DC_CHECK(false, "ggml_dequantize: not a ggml block type");
}

// The codes u[values] of one block (value = scale·u + offset, block_scales).
void decode_codes(GgmlType t, const uint8_t* b, uint8_t* u) {
  switch (t) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ4_1: case GgmlType::kQ5_1: {
      const bool five = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1, with_m = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
      const uint8_t* after = b + (with_m ? 4 : 2);
      nibbles32(after + (five ? 4 : 0), five ? u32_at(after) : 0, five, u);
      return;
    }
    case GgmlType::kQ8_0:
      for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(b[2 + j] ^ 0x80);  // q + 128
      return;
    case GgmlType::kQ2_K:
      for (int i = 0; i < 256; ++i) u[i] = static_cast<uint8_t>(two_bits(b + 16, i));
      return;
    case GgmlType::kQ3_K:
      for (int i = 0; i < 256; ++i) u[i] = static_cast<uint8_t>(two_bits(b + 32, i) + 4 * q3_high(b, i));
      return;
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: {
      const bool five = t == GgmlType::kQ5_K;
      for (int i = 0; i < 256; ++i) u[i] = static_cast<uint8_t>(k45_code(b + (five ? 48 : 16), five ? b + 16 : nullptr, i));
      return;
    }
    case GgmlType::kQ6_K:
      for (int i = 0; i < 256; ++i) u[i] = static_cast<uint8_t>(q6_code(b, i));
      return;
    case GgmlType::kNone: break;
  }
  DC_CHECK(false, "ggml_decode_u8: not a ggml block type");
}

}  // namespace

void ggml_block_scales(GgmlType t, const uint8_t* b, float* s, float* o) {
  switch (t) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ4_1: case GgmlType::kQ5_1: case GgmlType::kQ8_0: {
      const bool with_m = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
      const float d = f16_at(b);
      const float bias = t == GgmlType::kQ8_0 ? -128.0f : t == GgmlType::kQ5_0 ? -16.0f : -8.0f;
      s[0] = s[1] = d;
      o[0] = o[1] = with_m ? f16_at(b + 2) : bias * d;
      return;
    }
    case GgmlType::kQ2_K: {
      const float d = f16_at(b + 80), dmin = f16_at(b + 82);
      for (int g = 0; g < 16; ++g) {
        s[g] = d * static_cast<float>(b[g] & 0xF);
        o[g] = -(dmin * static_cast<float>(b[g] >> 4));
      }
      return;
    }
    case GgmlType::kQ3_K: {
      const float d = f16_at(b + 108);
      for (int g = 0; g < 16; ++g) {
        s[g] = d * static_cast<float>(q3_scale(b + 96, g) - 32);
        o[g] = -4.0f * s[g];
      }
      return;
    }
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: {
      const float d = f16_at(b), dmin = f16_at(b + 2);
      for (int sb = 0; sb < 8; ++sb) {
        int sc, m;
        k4_scale_min(b + 4, sb, &sc, &m);
        s[2 * sb] = s[2 * sb + 1] = d * static_cast<float>(sc);
        o[2 * sb] = o[2 * sb + 1] = -(dmin * static_cast<float>(m));
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const float d = f16_at(b + 208);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int g = 0; g < 16; ++g) {
        s[g] = d * static_cast<float>(sc[g]);
        o[g] = -32.0f * s[g];
      }
      return;
    }
    case GgmlType::kNone: break;
  }
  DC_CHECK(false, "ggml_block_scales: not a ggml block type");
}

GgmlBlockInfo ggml_block_info(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {"Q4_0", 32, 18};
    case GgmlType::kQ4_1: return {"Q4_1", 32, 20};
    case GgmlType::kQ5_0: return {"Q5_0", 32, 22};
    case GgmlType::kQ5_1: return {"Q5_1", 32, 24};
    case GgmlType::kQ8_0: return {"Q8_0", 32, 34};
    case GgmlType::kQ2_K: return {"Q2_K", 256, 84};
    case GgmlType::kQ3_K: return {"Q3_K", 256, 110};
    case GgmlType::kQ4_K: return {"Q4_K", 256, 144};
    case GgmlType::kQ5_K: return {"Q5_K", 256, 176};
    case GgmlType::kQ6_K: return {"Q6_K", 256, 210};
    case GgmlType::kNone: break;
  }
  return {nullptr, 0, 0};
}

void ggml_dequantize(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  const GgmlBlockInfo info = ggml_block_info(type);
  DC_CHECK(info.values > 0 && n % info.values == 0, "ggml_dequantize: n is not a multiple of the block");
  for (int64_t b = 0; b < n / info.values; ++b) dequantize_block(type, src + b * info.bytes, dst + b * info.values);
}

void ggml_decode_u8(GgmlType type, const uint8_t* src, int64_t n, uint8_t* codes, float* scale, float* offset) {
  const GgmlBlockInfo info = ggml_block_info(type);
  DC_CHECK(info.values > 0 && n % info.values == 0, "ggml_decode_u8: n is not a multiple of the block");
  const int64_t groups = info.values / kGgmlGroup;
  for (int64_t b = 0; b < n / info.values; ++b) {
    decode_codes(type, src + b * info.bytes, codes + b * info.values);
    ggml_block_scales(type, src + b * info.bytes, scale + b * groups, offset + b * groups);
  }
}

}  // namespace dc::cpu
