// The K-quant blocks' u8 codes in vector registers, written once for the two GGUF matmul paths
// (matmul_gguf.cc stores them into its panels, matmul_gguf_rows.cc joins them into 64-byte vectors); the
// scalar form is gguf_blocks.cc's ggml_decode_u8, the oracle of tests/ops/gguf_matmul_test.cc.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ops/cpu/gguf_blocks.h"

// The target of every GGUF matmul kernel (the callers are compiled for the baseline: run-time dispatch).
#define DC_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

namespace dc::cpu::gguf_codes {

DC_TARGET_VNNI inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// (v >> shift) & mask, per byte.
DC_TARGET_VNNI inline __m256i bits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(static_cast<char>(mask)));
}

// Q4_K (t = kQ4_K) or Q5_K (kQ5_K) block at b: the 32 codes of sub-block 2c in lo[c] (the low nibbles) and
// of sub-block 2c + 1 in hi[c] (the high nibbles), c in [0, 4); Q5_K adds its fifth bit << 4. Column order.
template <GgmlType t>
DC_TARGET_VNNI inline void k4_codes(const uint8_t* b, __m256i (&lo)[4], __m256i (&hi)[4]) {
  static_assert(t == GgmlType::kQ4_K || t == GgmlType::kQ5_K);
  constexpr bool kFive = t == GgmlType::kQ5_K;
  const uint8_t* qs = b + (kFive ? 48 : 16);
  const __m256i qh = kFive ? load256(b + 16) : _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i q = load256(qs + 32 * c);
    lo[c] = _mm256_and_si256(q, _mm256_set1_epi8(0x0f));
    hi[c] = bits(q, 4, 0x0f);
    if constexpr (kFive) {
      lo[c] = _mm256_or_si256(lo[c], _mm256_slli_epi16(bits(qh, 2 * c, 1), 4));
      hi[c] = _mm256_or_si256(hi[c], _mm256_slli_epi16(bits(qh, 2 * c + 1, 1), 4));
    }
  }
}

// Q6_K block at b: codes[4h + j] holds the 32 codes of columns [128h + 32j, 128h + 32j + 32), h in [0, 2):
// the 4 low bits from ql, the 2 high ones from qh.
DC_TARGET_VNNI inline void q6k_codes(const uint8_t* b, __m256i (&codes)[8]) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int h = 0; h < 2; ++h) {
    const __m256i ql0 = load256(b + 64 * h), ql1 = load256(b + 64 * h + 32), qh = load256(b + 128 + 32 * h);
    codes[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(bits(qh, 0, 3), 4));
    codes[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_slli_epi16(bits(qh, 2, 3), 4));
    codes[4 * h + 2] = _mm256_or_si256(bits(ql0, 4, 0x0f), _mm256_slli_epi16(bits(qh, 4, 3), 4));
    codes[4 * h + 3] = _mm256_or_si256(bits(ql1, 4, 0x0f), _mm256_slli_epi16(bits(qh, 6, 3), 4));
  }
}

}  // namespace dc::cpu::gguf_codes
