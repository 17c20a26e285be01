// ggml's block formats against hand-made blocks whose values are worked out by hand below, the
// quantizers' error bounds, and the finiteness checks of each type's scales.
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
  for (int i = 320; i < 352; ++i) x[i] = -0.3f - 0.02f * static_cast<float>(i % 5);  // an all-negative one
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

// The five types with kernels of their own since issue 42, against hand-made blocks (ggml's layouts,
// gguf_blocks.h).
TEST(GgufQuants, Q4_1Block) {
  std::vector<uint8_t> b(20, 0);
  set_f16(b, 0, 0x3800);  // d = 0.5
  set_f16(b, 2, 0xBC00);  // m = −1
  b[4] = 0x3A;            // value 0: 10, value 16: 3
  const auto y = dequant(GgufType::kQ4_1, b, 32);
  EXPECT_EQ(y[0], 4.0f);
  EXPECT_EQ(y[16], 0.5f);
  EXPECT_EQ(y[1], -1.0f);
}

TEST(GgufQuants, Q5_0Block) {
  std::vector<uint8_t> b(22, 0);
  set_f16(b, 0, 0x3800);                  // d = 0.5
  const uint32_t qh = 0x80010001u;        // fifth bits of values 0, 16 and 31
  std::memcpy(b.data() + 2, &qh, 4);
  b[6] = 0x21;                            // value 0: 1 (+16), value 16: 2 (+16)
  const auto y = dequant(GgufType::kQ5_0, b, 32);
  EXPECT_EQ(y[0], 0.5f);    // (17 − 16)·0.5
  EXPECT_EQ(y[16], 1.0f);   // (18 − 16)·0.5
  EXPECT_EQ(y[15], -8.0f);  // (0 − 16)·0.5
  EXPECT_EQ(y[31], 0.0f);   // (16 − 16)·0.5
}

TEST(GgufQuants, Q5_1Block) {
  std::vector<uint8_t> b(24, 0);
  set_f16(b, 0, 0x3400);  // d = 0.25
  set_f16(b, 2, 0x3C00);  // m = 1
  b[4] = 0x02;            // qh bit 1: the fifth bit of value 1
  b[8 + 1] = 0xF3;        // value 1: 3 (+16), value 17: 15
  const auto y = dequant(GgufType::kQ5_1, b, 32);
  EXPECT_EQ(y[1], 5.75f);   // 19·0.25 + 1
  EXPECT_EQ(y[17], 4.75f);  // 15·0.25 + 1
  EXPECT_EQ(y[0], 1.0f);
}

TEST(GgufQuants, Q2_KBlock) {
  std::vector<uint8_t> b(84, 0);
  set_f16(b, 80, 0x3C00);  // d = 1
  set_f16(b, 82, 0x3800);  // dmin = 0.5
  b[0] = 0x23;             // sub-block 0 (values 0..15): sc 3, m 2
  b[2] = 0x14;             // sub-block 2 (values 32..47): sc 4, m 1
  b[16] = 0x06;            // qs[0]: value 0 (bits 0-1) = 2, value 32 (bits 2-3) = 1
  const auto y = dequant(GgufType::kQ2_K, b, 256);
  EXPECT_EQ(y[0], 5.0f);    // 1·3·2 − 0.5·2
  EXPECT_EQ(y[32], 3.5f);   // 1·4·1 − 0.5·1
  EXPECT_EQ(y[1], -1.0f);   // code 0: −dmin·m
  EXPECT_EQ(y[16], 0.0f);   // sub-block 1: sc = m = 0
}

TEST(GgufQuants, Q3_KBlock) {
  std::vector<uint8_t> b(110, 0);
  set_f16(b, 108, 0x3800);  // d = 0.5
  b[96 + 0] = 0x01;         // scale 0: low 4 bits 1 ...
  b[96 + 8] = 0x02;         // ... high 2 bits 2: 33, i.e. 33 − 32 = 1
  b[96 + 7] = 0xF0;         // scale 15: low 4 bits 15 (high bits 0): 15 − 32 = −17
  b[0] = 0x01;              // hmask[0] bit 0: value 0's third bit
  b[32 + 0] = 0x03;         // qs[0] bits 0-1: value 0's low bits = 3
  b[32 + 63] = 0x40;        // qs[63] bits 6-7: value 255 (h 1, j 3, l 31) = 1
  b[31] = 0x80;             // hmask[31] bit 7 (4h + j): value 255's third bit
  const auto y = dequant(GgufType::kQ3_K, b, 256);
  EXPECT_EQ(y[0], 1.5f);     // 0.5·1·(3 + 4 − 4)
  EXPECT_EQ(y[1], -2.0f);    // 0.5·1·(0 − 4)
  EXPECT_EQ(y[255], -8.5f);  // 0.5·(−17)·(1 + 4 − 4)
  EXPECT_EQ(y[240], 34.0f);  // 0.5·(−17)·(0 − 4)
}

TEST(GgufQuants, RowFiniteChecksTheNewTypesScales) {
  struct Case {
    GgufType type;
    size_t bytes, at;
    int64_t n;
  };
  for (const Case& c : {Case{GgufType::kQ4_1, 20, 2, 32}, Case{GgufType::kQ5_0, 22, 0, 32}, Case{GgufType::kQ5_1, 24, 2, 32},
                        Case{GgufType::kQ2_K, 84, 82, 256}, Case{GgufType::kQ3_K, 110, 108, 256}}) {
    std::vector<uint8_t> b(c.bytes, 0);
    EXPECT_TRUE(gguf_row_finite(c.type, b.data(), c.n)) << static_cast<int>(c.type);
    set_f16(b, c.at, 0x7C00);  // inf in its (last) f16 field
    EXPECT_FALSE(gguf_row_finite(c.type, b.data(), c.n)) << static_cast<int>(c.type);
  }
}

TEST(GgufQuants, Q4_1QuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ4_1, quantize_q4_1,
                            [](const std::vector<uint8_t>& q, int64_t i) { return f16_of(q, i / 32 * 20); });
}

TEST(GgufQuants, Q5_0QuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ5_0, quantize_q5_0,
                            [](const std::vector<uint8_t>& q, int64_t i) { return f16_of(q, i / 32 * 22); });
}

TEST(GgufQuants, Q5_1QuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ5_1, quantize_q5_1,
                            [](const std::vector<uint8_t>& q, int64_t i) { return f16_of(q, i / 32 * 24); });
}

TEST(GgufQuants, Q2_KQuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ2_K, quantize_q2_k, [](const std::vector<uint8_t>& q, int64_t i) {
    const size_t blk = static_cast<size_t>(i / 256 * 84);
    return f16_of(q, blk + 80) * static_cast<float>(q[blk + i % 256 / 16] & 0xF);  // d · sc
  });
}

// Q3_K's 6-bit scale of sub-block s from its 12 bytes: low 4 bits in nibble s / 8 of byte s % 8, high 2 bits
// at bit 2·(s / 4) of byte 8 + s % 4.
int q3_scale_of(const uint8_t* scales, int s) {
  return ((scales[s % 8] >> (s < 8 ? 0 : 4)) & 0xF) | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4;
}

TEST(GgufQuants, Q3_KQuantizerWithinHalfAStep) {
  expect_within_half_a_step(GgufType::kQ3_K, quantize_q3_k, [](const std::vector<uint8_t>& q, int64_t i) {
    const size_t blk = static_cast<size_t>(i / 256 * 110);
    return std::fabs(f16_of(q, blk + 108) * static_cast<float>(q3_scale_of(q.data() + blk + 96, static_cast<int>(i % 256 / 16)) - 32));
  });
}

// The quantizers' fields land where ggml's layouts put them: inputs whose scales, mins and codes are worked
// out by hand below, checked byte by byte.
TEST(GgufQuants, Q4_1And5_1QuantizersFillTheirFields) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = -1.0f + 0.25f * static_cast<float>(j % 16);  // min −1, range 3.75 = 15 · 0.25
  std::vector<uint8_t> q(20);
  quantize_q4_1(x.data(), q.data(), 32);
  EXPECT_EQ(f16_of(q, 0), 0.25f);  // d
  EXPECT_EQ(f16_of(q, 2), -1.0f);  // m
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[4 + j], j * 0x11) << j;  // values j and j + 16: code j
  EXPECT_EQ(dequant(GgufType::kQ4_1, q, 32), x);
  for (int j = 0; j < 32; ++j) x[j] = -1.0f + 0.25f * static_cast<float>(j);  // range 7.75 = 31 · 0.25
  q.assign(24, 0);
  quantize_q5_1(x.data(), q.data(), 32);
  EXPECT_EQ(f16_of(q, 0), 0.25f);
  EXPECT_EQ(f16_of(q, 2), -1.0f);
  uint32_t qh;
  std::memcpy(&qh, q.data() + 4, 4);
  EXPECT_EQ(qh, 0xFFFF0000u);  // codes 16..31: the fifth bit
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q[8 + j], j * 0x11) << j;
  EXPECT_EQ(dequant(GgufType::kQ5_1, q, 32), x);
}

TEST(GgufQuants, Q5_0QuantizerFillsItsFields) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = 0.5f * static_cast<float>(j - 16);
  x[0] = -7.5f;   // code 1
  x[31] = 7.75f;  // max |x| = 15.5 · 0.5; x / d = 15.5 rounds to 16, clamped to code 31 (half a step off)
  std::vector<uint8_t> q(22);
  quantize_q5_0(x.data(), q.data(), 32);
  EXPECT_EQ(f16_of(q, 0), 0.5f);
  uint32_t qh;
  std::memcpy(&qh, q.data() + 2, 4);
  EXPECT_EQ(qh, 0xFFFF0000u);
  EXPECT_EQ(q[6], 0x01);  // value 0: code 1; value 16: code 16, low nibble 0
  for (int j = 1; j < 16; ++j) EXPECT_EQ(q[6 + j], j * 0x11) << j;
  const auto y = dequant(GgufType::kQ5_0, q, 32);
  EXPECT_EQ(y[0], -7.5f);
  EXPECT_EQ(y[31], 7.5f);
  EXPECT_EQ(y[17], 0.5f);
}

// Q2_K of x_i = i % 4 − 1 (sub-block 5, values 80..95, all zero): every other sub-block needs a min of 1 and 3
// steps of 1, so dmin and d are both the smallest f16 at least 1/15 (0x2C45 = 0.0667114...), m = sc = 15 and
// the codes are i % 4 (sub-block 5: sc = m = 0, codes 0).
TEST(GgufQuants, Q2_KQuantizerFillsItsFields) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = i / 16 == 5 ? 0.0f : static_cast<float>(i % 4) - 1.0f;
  std::vector<uint8_t> q(84);
  quantize_q2_k(x.data(), q.data(), 256);
  EXPECT_EQ(q[80] | q[81] << 8, 0x2C45);  // d
  EXPECT_EQ(q[82] | q[83] << 8, 0x2C45);  // dmin
  for (int s = 0; s < 16; ++s) EXPECT_EQ(q[s], s == 5 ? 0x00 : 0xFF) << s;  // sc | m << 4
  // qs[32h + l] holds values 128h + 32j + l (j = 0..3) at bits 2j: code l % 4 in each, but for values
  // 80..95 (h 0, j 2, l 16..31).
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(q[16 + l], (l % 4) * (l < 16 ? 0x55 : 0x45)) << l;
    EXPECT_EQ(q[16 + 32 + l], (l % 4) * 0x55) << l;
  }
  const auto y = dequant(GgufType::kQ2_K, q, 256);
  for (int i = 0; i < 256; ++i) ASSERT_NEAR(y[i], x[i], 0.5 * 15 * 0.0667114) << i;
}

// Q3_K of x_i = c·(i % 8 − 4), c = 1 but −1 in sub-block 7: steps of +1 (−1) put the sub-block in
// [−4, 3]·step, so d is the smallest f16 at least 1/31 (0x2822 = 0.0322876...), the scales s − 32 = 31
// (s 63) and −31 (s 1), and every code is i % 8.
TEST(GgufQuants, Q3_KQuantizerFillsItsFields) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = (i / 16 == 7 ? -1.0f : 1.0f) * static_cast<float>(i % 8 - 4);
  std::vector<uint8_t> q(110);
  quantize_q3_k(x.data(), q.data(), 256);
  EXPECT_EQ(q[108] | q[109] << 8, 0x2822);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(q[96 + k], k == 7 ? 0xF1 : 0xFF) << k;  // low nibbles: s 7 (1) | s 15 (63)
  for (int k = 8; k < 12; ++k) EXPECT_EQ(q[96 + k], k == 11 ? 0xF3 : 0xFF) << k;  // s 7's high bits: byte 11, bits 2-3
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(q[l], l % 8 >= 4 ? 0xFF : 0x00) << l;  // hmask: the third bit of every value at l
    EXPECT_EQ(q[32 + l], (l % 4) * 0x55) << l;
    EXPECT_EQ(q[64 + l], (l % 4) * 0x55) << l;
  }
  const auto y = dequant(GgufType::kQ3_K, q, 256);
  for (int i = 0; i < 256; ++i) ASSERT_NEAR(y[i], x[i], 0.5 * 31 * 0.0322876) << i;
}

}  // namespace
}  // namespace dc
