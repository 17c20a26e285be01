// ggml's quantized block formats as the matmul kernels read them in place (WeightQuant::kGguf, the bytes
// of a GGUF file's tensor): each type's block size, its dequantization (the reference kernel's), and its
// decoding into unsigned byte codes with an f32 scale and offset per 16 columns (the fast kernel's).
// Little-endian, d / dmin / m as f16; value layouts (ggml's, ggml-common.h):
//   Q4_0 (32 values, 18 B): d, qs[16] (j in the low nibble of qs[j], j+16 in the high one); x = d·(q − 8)
//   Q4_1 (32, 20 B): d, m, qs[16] as Q4_0;                                                    x = d·q + m
//   Q5_0 (32, 22 B): d, u32 qh (bit j: the fifth bit of value j), qs[16] as Q4_0;             x = d·(q − 16)
//   Q5_1 (32, 24 B): d, m, u32 qh, qs[16];                                                    x = d·q + m
//   Q8_0 (32, 34 B): d, int8 q[32];                                                           x = d·q
//   Q2_K (256, 84 B): scales[16] (sub-block of 16: low nibble sc, high nibble m), qs[64] (2-bit codes:
//        value 128h + 32j + l at bits 2j of qs[32h + l]), d, dmin;              x = d·sc·q − dmin·m
//   Q3_K (256, 110 B): hmask[32] (bit 4h + j of hmask[l]: the third bit of value 128h + 32j + l), qs[64]
//        (low 2 bits, as Q2_K), scales[12] (16 6-bit scales s, packed), d;  x = d·(s − 32)·(q − 4)
//   Q4_K (256, 144 B): d, dmin, scales[12] (8 sub-blocks of 32: 6-bit sc and m), qs[128];  x = d·sc·q − dmin·m
//   Q5_K (256, 176 B): d, dmin, scales[12], qh[32] (bit s of qh[l]: fifth bit), qs[128];  x = d·sc·q − dmin·m
//   Q6_K (256, 210 B): ql[128], qh[64], int8 scales[16], d;                                 x = d·sc·(q − 32)
#pragma once

#include <cstdint>

namespace dc::cpu {

// ggml's type ids of the block types the kernels read (the ids GGUF files store).
enum class GgmlType : uint8_t {
  kNone = 0,  // not a ggml block type (a WeightView of another WeightQuant)
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
};

// Values per block: 256 for the K-quants, else 32 (kNone: 0).
constexpr int64_t ggml_block_values(GgmlType t) {
  return t == GgmlType::kNone ? 0 : static_cast<uint8_t>(t) >= 10 ? 256 : 32;
}

struct GgmlBlockInfo {
  const char* name;  // "Q4_K"
  int64_t values;    // values per block: 32 or 256
  int64_t bytes;     // bytes per block
};
// The block of `type`; {nullptr, 0, 0} for kNone.
GgmlBlockInfo ggml_block_info(GgmlType type);
// Bytes of one row of `cols` values (cols a multiple of the block).
inline int64_t ggml_row_bytes(GgmlType type, int64_t cols) {
  const GgmlBlockInfo b = ggml_block_info(type);
  return cols / b.values * b.bytes;
}

// Dequantizes the n values (a multiple of the block) stored at src as `type` into dst[n], in f32 exactly
// as ggml writes them (the scale products d·sc rounded to f32 once, then times the code).
void ggml_dequantize(GgmlType type, const uint8_t* src, float* dst, int64_t n);

// Columns per scale / offset of the decoded form.
constexpr int64_t kGgmlGroup = 16;

// The decoded form of the n values (a multiple of the block) at src: codes[n] unsigned bytes and, per 16
// values, scale[n/16] and offset[n/16] f32 with value = scale·code + offset (Q8_0: code q + 128, offset
// −128·d; Q4_0: offset −8·d; Q3_K: code q + 4 in [0, 7], offset −4·scale; Q6_K: offset −32·scale; ...).
// scale·code + offset equals ggml_dequantize's value up to one f32 rounding of each product.
void ggml_decode_u8(GgmlType type, const uint8_t* src, int64_t n, uint8_t* codes, float* scale, float* offset);
// The scale[values/16] and offset[values/16] of ggml_decode_u8 for the one block at src.
void ggml_block_scales(GgmlType type, const uint8_t* src, float* scale, float* offset);

}  // namespace dc::cpu
