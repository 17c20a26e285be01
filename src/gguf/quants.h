// ggml's block formats on the GGUF side: dequantization of every type this engine reads (the quantized
// ones are ops/cpu/gguf_blocks.h's, whose header documents each layout: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K
// Q4_K Q5_K Q6_K), the finiteness check of a row's scales, and the quantizers `convert` writes:
//   Q8_0 (32 values, 34 B): d, int8 q[32];                              x = d·q
//   Q4_0 (32 values, 18 B): d, u8 qs[16]: value j in the low nibble of qs[j], j+16 in the high one;
//                           x = d·(q − 8)
//   Q4_K (256 values, 144 B): d, dmin, u8 scales[12] (8 sub-blocks of 32: a 6-bit scale sc and min m
//        each), u8 qs[128]: 64-value chunk k's sub-block 2k in the low nibbles of qs[32k..32k+31], 2k+1 in
//        the high ones;  x = d·sc·q − dmin·m
//   Q5_K (256 values, 176 B): d, dmin, scales[12] as Q4_K, u8 qh[32] (the fifth bit: value l of
//        sub-block s in bit s of qh[l]), u8 qs[128] as Q4_K;  x = d·sc·q − dmin·m, q in [0, 31]
//   Q6_K (256 values, 210 B): u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), int8 scales[16] (one per
//        16 values), d;  x = d·scale·(q − 32)
// The loader keeps the file's blocks as they are (gguf/dream.h); nothing here re-packs them.
#pragma once

#include <cstdint>

#include "gguf/gguf_file.h"

namespace dc {

// Converts the n values (a multiple of the type's block) stored at src in `type` to f32 into dst[n].
void gguf_dequantize(GgufType type, const uint8_t* src, float* dst, int64_t n);

// The 6-bit scale and min of sub-block j (0..7) from a K-quant's 12 packed scale bytes.
void k_quant_scale_min(const uint8_t* scales, int j, int* sc, int* m);

// Quantizers of n f32 values (n a multiple of the block) into `out` (n / block · block bytes), each
// value within half a step of its original (d, dmin and the sub-block scales round up, never down):
//   Q8_0: d = max|x| / 127 (stored f16), q = round(x / d): |x − d·q| ≤ d/2.
//   Q4_0: d = max|x| / 7.5 rounded up to an f16, q − 8 = round(x / d) in [−8, 7]: |x − x̂| ≤ d/2.
//   Q4_K / Q5_K: per 32-value sub-block the range [min(0, min x), max(0, max x)]; the 6-bit m rounds
//         −min up to a multiple of dmin and the 6-bit sc rounds the step up to a multiple of d (d, dmin
//         the smallest f16 values that let the largest sub-block fit in 63), so every value lies within
//         15 (Q5_K: 31) steps and q = round((x + dmin·m) / (d·sc)) is within half a step: |x − x̂| ≤ d·sc / 2.
//   Q6_K: per 16-value sub-block the step max|x| / 31 rounded up to a multiple d·sc of the block's f16
//         d (the int8 sc ≤ 127), q = round(x / (d·sc)) in [−31, 31]: |x − x̂| ≤ d·sc / 2.
// Non-finite inputs are the caller's to refuse.
// Whether the f32 / f16 / bf16 fields of n values stored as `type` are finite: the elements of the
// float types, the block scales (d, dmin) of the quantized ones.
bool gguf_row_finite(GgufType type, const uint8_t* row, int64_t n);

void quantize_q8_0(const float* x, uint8_t* out, int64_t n);
void quantize_q4_0(const float* x, uint8_t* out, int64_t n);
void quantize_q4_k(const float* x, uint8_t* out, int64_t n);
void quantize_q5_k(const float* x, uint8_t* out, int64_t n);
void quantize_q6_k(const float* x, uint8_t* out, int64_t n);

}  // namespace dc
