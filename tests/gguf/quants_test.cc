// ggml's block formats against hand-made blocks whose values are worked out by hand below, the
// quantizers' error bounds, and the q4 repacking (Q4_0 exact, Q4_K within its stated bound).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/splitmix64.h"
#include "gguf/quants.h"

namespace dc {
namespace {

void set_f16(std::vector<uint8_t>& b, size_t at, uint16_t bits) { std::memcpy(b.data() + at, &bits, 2); }

std::vector<float> dequant(GgufType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  gguf_dequantize(t, b.data(), y.data(), n);
  return y;
}

TEST(GgufQuants, Q8_0Block) {
  std::vector<uint8_t> b(34, 0);
  set_f16(b, 0, 0x3800);  // d = 0.5
  b[2] = static_cast<uint8_t>(-3);
  b[3 + 30] = 5;  // q[31]
  const auto y = dequant(GgufType::kQ8_0, b, 32);
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[31], 2.5f);
}

TEST(GgufQuants, Q4_0Block) {
  std::vector<uint8_t> b(18, 0x88);  // every q = 8: value 0
  set_f16(b, 0, 0x3400);             // d = 0.25
  b[2] = 0x93;                       // value 0: q 3 -> (3-8)/4; value 16: q 9 -> (9-8)/4
  const auto y = dequant(GgufType::kQ4_0, b, 32);
  EXPECT_EQ(y[0], -1.25f);
  EXPECT_EQ(y[16], 0.25f);
  EXPECT_EQ(y[5], 0.0f);
}

// A K-quant header: d = 1, dmin = 0.5; sub-block 0: sc 2, m 4; sub-block 5: sc 37 (0b100101), m 20
// (0b010100): scales[9] = 5 | 4 << 4, the high bits in scales[1] (2 << 6) and scales[5] (1 << 6).
std::vector<uint8_t> k_header(size_t size) {
  std::vector<uint8_t> b(size, 0);
  set_f16(b, 0, 0x3C00);
  set_f16(b, 2, 0x3800);
  b[4 + 0] = 2;
  b[4 + 4] = 4;
  b[4 + 9] = 0x45;
  b[4 + 1] |= 2 << 6;
  b[4 + 5] |= 1 << 6;
  return b;
}

TEST(GgufQuants, KScaleUnpacking) {
  const auto b = k_header(144);
  int sc, m;
  k_quant_scale_min(b.data() + 4, 0, &sc, &m);
  EXPECT_EQ(sc, 2);
  EXPECT_EQ(m, 4);
  k_quant_scale_min(b.data() + 4, 5, &sc, &m);
  EXPECT_EQ(sc, 37);
  EXPECT_EQ(m, 20);
  k_quant_scale_min(b.data() + 4, 1, &sc, &m);  // only the high bits of 5 are in these bytes
  EXPECT_EQ(sc, 0);
  EXPECT_EQ(m, 0);
}

TEST(GgufQuants, Q4_KBlock) {
  auto b = k_header(144);
  b[16 + 0] = 0x07;        // sub-block 0 (chunk 0, low nibble), value 0: q 7 -> 1·2·7 − 0.5·4 = 12
  b[16 + 64 + 3] = 0xB0;   // sub-block 5 (chunk 2, high nibble), value 3: q 11 -> 37·11 − 0.5·20 = 397
  const auto y = dequant(GgufType::kQ4_K, b, 256);
  EXPECT_EQ(y[0], 12.0f);
  EXPECT_EQ(y[1], -2.0f);   // q 0 in sub-block 0: −dmin·m
  EXPECT_EQ(y[32], 0.0f);   // sub-block 1: sc = m = 0
  EXPECT_EQ(y[5 * 32 + 3], 397.0f);
  EXPECT_EQ(y[4 * 32 + 3], 0.0f);  // the low nibble of that byte: sub-block 4, sc = m = 0
}

TEST(GgufQuants, Q5_KBlock) {
  auto b = k_header(176);
  b[16 + 0] = 0x01;        // qh[0] bit 0: value 0 of sub-block 0 gets +16
  b[16 + 3] = 0x20;        // qh[3] bit 5: value 3 of sub-block 5 gets +16
  b[48 + 0] = 0x07;        // q 7 + 16 = 23 -> 2·23 − 2 = 44
  b[48 + 64 + 3] = 0xB0;   // q 11 + 16 = 27 -> 37·27 − 10 = 989
  const auto y = dequant(GgufType::kQ5_K, b, 256);
  EXPECT_EQ(y[0], 44.0f);
  EXPECT_EQ(y[5 * 32 + 3], 989.0f);
  EXPECT_EQ(y[2], -2.0f);
}

TEST(GgufQuants, Q6_KBlock) {
  std::vector<uint8_t> b(210, 0);
  set_f16(b, 208, 0x3800);  // d = 0.5
  int8_t* sc = reinterpret_cast<int8_t*>(b.data() + 192);
  sc[0] = 3, sc[6] = -2, sc[12] = 4;
  b[0] = 0x05;          // ql[0] low 5, qh[0] bits 0-1 = 2: q = 5 | 32 = 37 -> 0.5·3·(37−32) = 7.5
  b[128 + 0] = 0x02;
  b[33] = 0xA0;         // value 97 (l = 1, fourth quarter): ql[33] high 10, qh[1] bits 6-7 = 1: 26 − 32 = −6
  b[128 + 1] = 0x40;    //   scale sc[6]: 0.5·(−2)·(−6) = 6
  b[64] = 0x30;         // second half, value 128 + 64: ql[64] high 3, qh[32] bits 4-5 = 3: 51 − 32 = 19
  b[128 + 32] = 0x30;   //   scale sc[8 + 4]: 0.5·4·19 = 38
  const auto y = dequant(GgufType::kQ6_K, b, 256);
  EXPECT_EQ(y[0], 7.5f);
  EXPECT_EQ(y[97], 6.0f);
  EXPECT_EQ(y[128 + 64], 38.0f);
  EXPECT_EQ(y[1], 0.5f * 3 * -32);  // q 0 -> −32
}

TEST(GgufQuants, FloatTypes) {
  const uint16_t f16[2] = {0x3C00, 0xC000};   // 1, −2
  const uint16_t bf16[2] = {0x3F80, 0x4040};  // 1, 3
  float y[2];
  gguf_dequantize(GgufType::kF16, reinterpret_cast<const uint8_t*>(f16), y, 2);
  EXPECT_EQ(y[1], -2.0f);
  gguf_dequantize(GgufType::kBF16, reinterpret_cast<const uint8_t*>(bf16), y, 2);
  EXPECT_EQ(y[1], 3.0f);
}

std::vector<float> random_values(int64_t n, uint64_t seed, float scale) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[i] = scale * (static_cast<float>(splitmix64(seed + static_cast<uint64_t>(i)) >> 40) / 16777216.0f - 0.5f);
  x[7] = 0.0f;
  return x;
}

TEST(GgufQuants, Q8_0QuantizerWithinHalfAStep) {
  const int64_t n = 256;
  const auto x = random_values(n, 11, 3.0f);
  std::vector<uint8_t> q(n / 32 * 34);
  quantize_q8_0(x.data(), q.data(), n);
  const auto y = dequant(GgufType::kQ8_0, q, n);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t d;
    std::memcpy(&d, q.data() + i / 32 * 34, 2);
    ASSERT_LE(std::fabs(x[i] - y[i]), f16_to_f32(d) / 2 + 1e-7f) << "value " << i;
  }
}

TEST(GgufQuants, Q4_KQuantizerWithinHalfAStep) {
  const int64_t n = 512;
  auto x = random_values(n, 5, 2.0f);
  for (int i = 256; i < 288; ++i) x[i] = 0.5f + 0.01f * static_cast<float>(i % 3);  // an all-positive sub-block
  std::vector<uint8_t> q(n / 256 * 144);
  quantize_q4_k(x.data(), q.data(), n);
  const auto y = dequant(GgufType::kQ4_K, q, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* blk = q.data() + i / 256 * 144;
    uint16_t d;
    std::memcpy(&d, blk, 2);
    int sc, m;
    k_quant_scale_min(blk + 4, static_cast<int>(i % 256 / 32), &sc, &m);
    const float step = f16_to_f32(d) * static_cast<float>(sc);
    ASSERT_LE(std::fabs(x[i] - y[i]), step / 2 + 1e-6f) << "value " << i;
  }
  std::vector<float> zeros(256, 0.0f);
  quantize_q4_k(zeros.data(), q.data(), 256);
  EXPECT_EQ(dequant(GgufType::kQ4_K, q, 256), zeros);
}

// Our converter's other quantizers (quants.h): every value within half of its own step, and zeros exact.
// step(q, i): the step of value i in the quantized bytes q.
void expect_within_half_a_step(GgufType type, void (*quantize)(const float*, uint8_t*, int64_t),
                               float (*step)(const std::vector<uint8_t>&, int64_t)) {
  const GgufTypeInfo info = *gguf_type_info(static_cast<uint32_t>(type));
  const int64_t n = 512;
  auto x = random_values(n, 21, 2.0f);
  for (int i = 256; i < 288; ++i) x[i] = 0.5f + 0.01f * static_cast<float>(i % 3);  // an all-positive sub-block
  x[300] = -7.0f;                                                                 // an outlier
  std::vector<uint8_t> q(static_cast<size_t>(n / info.block * info.bytes));
  quantize(x.data(), q.data(), n);
  const auto y = dequant(type, q, n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_LE(std::fabs(x[i] - y[i]), step(q, i) / 2 + 1e-6f) << info.name << " value " << i << ": " << x[i] << " vs " << y[i];
  std::vector<float> zeros(static_cast<size_t>(info.block), 0.0f);
  quantize(zeros.data(), q.data(), info.block);
  EXPECT_EQ(dequant(type, q, info.block), zeros) << info.name;
}

float f16_of(const std::vector<uint8_t>& q, size_t at) { return f16_to_f32(static_cast<uint16_t>(q[at] | q[at + 1] << 8)); }

TEST(GgufQuants, Q4_0QuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ4_0, quantize_q4_0,
                            [](const std::vector<uint8_t>& q, int64_t i) { return f16_of(q, i / 32 * 18); });
}

TEST(GgufQuants, Q5_KQuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ5_K, quantize_q5_k, [](const std::vector<uint8_t>& q, int64_t i) {
    const size_t blk = static_cast<size_t>(i / 256 * 176);
    int sc, m;
    k_quant_scale_min(q.data() + blk + 4, static_cast<int>(i % 256 / 32), &sc, &m);
    return f16_of(q, blk) * static_cast<float>(sc);
  });
}

TEST(GgufQuants, Q6_KQuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ6_K, quantize_q6_k, [](const std::vector<uint8_t>& q, int64_t i) {
    const size_t blk = static_cast<size_t>(i / 256 * 210);
    return f16_of(q, blk + 208) * static_cast<float>(static_cast<int8_t>(q[blk + 192 + i % 256 / 16]));
  });
}

// Our q4 (group 32): value c of a row = scale[c/32]·q + min[c/32], q the nibble.
std::vector<float> q4_values(const std::vector<uint8_t>& codes, const std::vector<uint16_t>& scales,
                             const std::vector<uint16_t>& mins, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    const int q = c % 2 ? codes[c / 2] >> 4 : codes[c / 2] & 0xF;
    y[c] = f16_to_f32(scales[c / 32]) * static_cast<float>(q) + f16_to_f32(mins[c / 32]);
  }
  return y;
}

TEST(GgufQuants, RepackQ4_0IsExact) {
  const int64_t n = 64;
  std::vector<uint8_t> src(2 * 18);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(splitmix64(i) >> 56);
  set_f16(src, 0, 0x2E66);   // d ≈ 0.1
  set_f16(src, 18, 0xB400);  // d = −0.25
  std::vector<uint8_t> codes(n / 2);
  std::vector<uint16_t> scales(n / 32), mins(n / 32);
  repack_q4_row(GgufType::kQ4_0, src.data(), n, codes.data(), scales.data(), mins.data());
  EXPECT_EQ(q4_values(codes, scales, mins, n), dequant(GgufType::kQ4_0, src, n));
}

TEST(GgufQuants, RepackRefusesNonFiniteScales) {
  std::vector<uint8_t> q40(18, 0x11);
  set_f16(q40, 0, 0x7C00);  // d = inf
  std::vector<uint8_t> codes(16);
  std::vector<uint16_t> scales(1), mins(1);
  EXPECT_FALSE(repack_q4_row(GgufType::kQ4_0, q40.data(), 32, codes.data(), scales.data(), mins.data()));
  set_f16(q40, 0, 0x7BFF);  // d = 65504: finite, but its min −8d is beyond f16's range
  EXPECT_FALSE(repack_q4_row(GgufType::kQ4_0, q40.data(), 32, codes.data(), scales.data(), mins.data()));
  set_f16(q40, 0, 0x3C00);  // d = 1
  EXPECT_TRUE(repack_q4_row(GgufType::kQ4_0, q40.data(), 32, codes.data(), scales.data(), mins.data()));
}

TEST(GgufQuants, RowFiniteChecksEachTypesScales) {
  std::vector<uint8_t> q6(210, 0);
  EXPECT_TRUE(gguf_row_finite(GgufType::kQ6_K, q6.data(), 256));
  set_f16(q6, 208, 0x7E00);  // d = NaN
  EXPECT_FALSE(gguf_row_finite(GgufType::kQ6_K, q6.data(), 256));
  std::vector<uint8_t> q4k(144, 0);
  set_f16(q4k, 2, 0xFC00);  // dmin = −inf
  EXPECT_FALSE(gguf_row_finite(GgufType::kQ4_K, q4k.data(), 256));
  std::vector<uint8_t> f16(4, 0);
  set_f16(f16, 2, 0x7C00);
  EXPECT_FALSE(gguf_row_finite(GgufType::kF16, f16.data(), 2));
  const std::vector<uint8_t> bf16 = {0x80, 0x3F, 0x80, 0x7F};  // 1.0, +inf
  EXPECT_FALSE(gguf_row_finite(GgufType::kBF16, bf16.data(), 2));
  EXPECT_TRUE(gguf_row_finite(GgufType::kBF16, bf16.data(), 1));
}

TEST(GgufQuants, RepackQ4_KWithinItsBound) {
  const int64_t n = 256;
  const auto x = random_values(n, 9, 1.0f);
  std::vector<uint8_t> src(144);
  quantize_q4_k(x.data(), src.data(), n);
  std::vector<uint8_t> codes(n / 2);
  std::vector<uint16_t> scales(n / 32), mins(n / 32);
  repack_q4_row(GgufType::kQ4_K, src.data(), n, codes.data(), scales.data(), mins.data());
  const auto want = dequant(GgufType::kQ4_K, src, n);
  const auto got = q4_values(codes, scales, mins, n);
  const float d = f16_to_f32(static_cast<uint16_t>(src[0] | src[1] << 8));
  const float dmin = f16_to_f32(static_cast<uint16_t>(src[2] | src[3] << 8));
  for (int64_t i = 0; i < n; ++i) {
    int sc, m;
    k_quant_scale_min(src.data() + 4, static_cast<int>(i / 32), &sc, &m);
    const float bound = (15.0f * d * static_cast<float>(sc) + dmin * static_cast<float>(m)) * std::ldexp(1.0f, -11);
    ASSERT_LE(std::fabs(got[i] - want[i]), bound + 1e-7f) << "value " << i;
  }
}

}  // namespace
}  // namespace dc
