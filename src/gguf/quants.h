// ggml's block formats on the GGUF side: dequantization of every type this engine reads (the quantized
// ones are ops/cpu/gguf_blocks.h's, whose header documents each layout: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K
// Q4_K Q5_K Q6_K), the finiteness check of a row's scales, and the quantizers `convert` writes, one per type.
// The loader keeps the file's blocks as they are (gguf/dream.h); nothing here re-packs them.
#pragma once

#include <cstdint>

#include "gguf/gguf_file.h"

namespace dc {

// Converts the n values (a multiple of the type's block) stored at src in `type` to f32 into dst[n].
void gguf_dequantize(GgufType type, const uint8_t* src, float* dst, int64_t n);

// The 6-bit scale and min of sub-block j (0..7) from a K-quant's 12 packed scale bytes.
void k_quant_scale_min(const uint8_t* scales, int j, int* sc, int* m);

// Whether the f32 / f16 / bf16 fields of n values stored as `type` are finite: the elements of the
// float types, the block scales (d, dmin) of the quantized ones.
bool gguf_row_finite(GgufType type, const uint8_t* row, int64_t n);

// Quantizers of n f32 values (n a multiple of the block) into `out` (n / block · block bytes) in the layouts
// of ops/cpu/gguf_blocks.h, each value within half a step of its original (the f16 scales round so that the
// range fits, never so that it is cut):
//   Q8_0: d = max|x| / 127 (stored f16), q = round(x / d): |x − d·q| ≤ d/2.
//   Q4_0 / Q5_0: d = max|x| / 7.5 (15.5) rounded up to an f16, q − 8 (16) = round(x / d) in [−8, 7]
//         ([−16, 15]): |x − x̂| ≤ d/2.
//   Q4_1 / Q5_1: m = min x rounded down to an f16, d = (max x − m) / 15 (31) rounded up, q = round((x − m) / d)
//         in [0, 15] ([0, 31]): |x − x̂| ≤ d/2.
//   Q2_K / Q4_K / Q5_K: per sub-block (16 values with 4-bit sc and m for Q2_K, 32 with 6-bit ones for Q4_K /
//         Q5_K) the range [min(0, min x), max(0, max x)]; m rounds −min up to a multiple of dmin and sc rounds
//         the step up to a multiple of d (d, dmin the smallest f16 values that let the widest sub-block fit
//         in 15 or 63), so every value lies within 3 (Q2_K), 15 (Q4_K) or 31 (Q5_K) steps and
//         q = round((x + dmin·m) / (d·sc)) is within half a step: |x − x̂| ≤ d·sc / 2.
//   Q3_K: per 16-value sub-block the signed step t with the smallest |t| that maps it into [−4, 3.5]·t,
//         rounded (away from 0) to a multiple d·(s − 32) of the block's f16 d (|s − 32| ≤ 31),
//         q = round(x / t) in [−4, 3]: |x − x̂| ≤ |t| / 2.
//   Q6_K: per 16-value sub-block the step max|x| / 31 rounded up to a multiple d·sc of the block's f16
//         d (the int8 sc ≤ 127), q = round(x / (d·sc)) in [−31, 31]: |x − x̂| ≤ d·sc / 2.
// Non-finite inputs are the caller's to refuse, and so are f16 scales that overflow (gguf_row_finite).

void quantize_q8_0(const float* x, uint8_t* out, int64_t n);
void quantize_q4_0(const float* x, uint8_t* out, int64_t n);
void quantize_q4_1(const float* x, uint8_t* out, int64_t n);
void quantize_q5_0(const float* x, uint8_t* out, int64_t n);
void quantize_q5_1(const float* x, uint8_t* out, int64_t n);
void quantize_q2_k(const float* x, uint8_t* out, int64_t n);
void quantize_q3_k(const float* x, uint8_t* out, int64_t n);
void quantize_q4_k(const float* x, uint8_t* out, int64_t n);
void quantize_q5_k(const float* x, uint8_t* out, int64_t n);
void quantize_q6_k(const float* x, uint8_t* out, int64_t n);

}  // namespace dc
