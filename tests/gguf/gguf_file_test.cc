// The GGUF reader: every metadata type, arrays, alignment and the tensor table of a hand-built file;
// bad files (truncated at every byte, wrong magic / version, offsets past the end, overlap, unknown
// types, absurd counts and lengths, bad alignment, duplicates) give errors naming the problem.
#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf_test_util.h"

namespace dc {
namespace {

using test::Bytes;
using test::tensor_info;

// A valid file: one key of every type (and a nested array), alignment 64, two F32 tensors.
Bytes good_file(uint64_t second_offset = 64, uint32_t second_type = 0, uint32_t alignment = 64) {
  Bytes h;
  h.b = {'G', 'G', 'U', 'F'};
  h.put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(15);
  h.str("general.architecture").put<uint32_t>(8).str("dream");
  h.str("general.alignment").put<uint32_t>(4).put<uint32_t>(alignment);
  h.str("k.u8").put<uint32_t>(0).put<uint8_t>(200);
  h.str("k.i8").put<uint32_t>(1).put<int8_t>(-100);
  h.str("k.u16").put<uint32_t>(2).put<uint16_t>(60000);
  h.str("k.i16").put<uint32_t>(3).put<int16_t>(-30000);
  h.str("k.u32").put<uint32_t>(4).put<uint32_t>(4000000000u);
  h.str("k.i32").put<uint32_t>(5).put<int32_t>(-2000000000);
  h.str("k.f32").put<uint32_t>(6).put<float>(0.25f);
  h.str("k.bool").put<uint32_t>(7).put<uint8_t>(1);
  h.str("k.u64").put<uint32_t>(10).put<uint64_t>(uint64_t{1} << 40);
  h.str("k.i64").put<uint32_t>(11).put<int64_t>(-(int64_t{1} << 40));
  h.str("k.f64").put<uint32_t>(12).put<double>(1e-6);
  h.str("k.strings").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("bc");
  h.str("k.nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).put<uint32_t>(5).put<uint64_t>(2)
      .put<int32_t>(7).put<int32_t>(-7);
  tensor_info(h, "a", {4, 2}, 0, 0);                        // 32 bytes at 0
  tensor_info(h, "b", {8}, second_type, second_offset);     // 32 bytes (F32)
  h.pad_to(alignment);
  for (int i = 0; i < 8; ++i) h.put<float>(static_cast<float>(i));
  h.b.resize(h.b.size() + 32, 0);  // up to 64
  for (int i = 0; i < 8; ++i) h.put<float>(static_cast<float>(-i));
  return h;
}

Result<ParsedGguf> parse(const Bytes& f) { return parse_gguf(f.b.data(), f.b.size(), "t.gguf"); }

TEST(GgufFile, ParsesEveryValueTypeAndTheTensorTable) {
  const Bytes f = good_file();
  auto g = parse(f);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->version, 3u);
  EXPECT_EQ(g->alignment, 64u);
  EXPECT_EQ(g->data_offset % 64, 0u);
  const auto& m = g->metadata;
  EXPECT_EQ(m.at("general.architecture").s, "dream");
  EXPECT_EQ(m.at("k.u8").i, 200);
  EXPECT_EQ(m.at("k.i8").i, -100);
  EXPECT_EQ(m.at("k.u16").i, 60000);
  EXPECT_EQ(m.at("k.i16").i, -30000);
  EXPECT_EQ(m.at("k.u32").i, 4000000000LL);
  EXPECT_EQ(m.at("k.i32").i, -2000000000);
  EXPECT_EQ(m.at("k.f32").f, 0.25);
  EXPECT_EQ(m.at("k.bool").i, 1);
  EXPECT_EQ(m.at("k.u64").i, int64_t{1} << 40);
  EXPECT_EQ(m.at("k.i64").i, -(int64_t{1} << 40));
  EXPECT_EQ(m.at("k.f64").f, 1e-6);
  ASSERT_EQ(m.at("k.strings").strings.size(), 2u);
  EXPECT_EQ(m.at("k.strings").strings[1], "bc");
  ASSERT_EQ(m.at("k.nested").items.size(), 1u);
  EXPECT_EQ(m.at("k.nested").items[0].int_at(1), -7);
  ASSERT_EQ(g->tensors.size(), 2u);
  EXPECT_EQ(g->tensors[0].dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(g->tensors[0].n_bytes, 32u);
  float v;
  std::memcpy(&v, g->tensors[1].data + 4 * 3, 4);
  EXPECT_EQ(v, -3.0f);
  EXPECT_EQ(g->tensors[0].data, f.b.data() + g->data_offset);
}

void expect_error(const Bytes& f, const std::string& needle) {
  auto g = parse(f);
  ASSERT_FALSE(g.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(g.status().message().find(needle), std::string::npos) << g.status().to_string();
  EXPECT_NE(g.status().message().find("t.gguf"), std::string::npos) << g.status().to_string();
}

TEST(GgufFile, EveryTruncationIsAnError) {
  const Bytes f = good_file();
  for (size_t n = 0; n < f.b.size(); ++n) {
    Bytes cut;
    cut.b.assign(f.b.begin(), f.b.begin() + static_cast<std::ptrdiff_t>(n));
    auto g = parse_gguf(cut.b.data(), cut.b.size(), "t.gguf");
    ASSERT_FALSE(g.ok()) << "a file cut at " << n << " of " << f.b.size() << " bytes parsed";
  }
}

TEST(GgufFile, WrongMagicAndVersion) {
  Bytes f = good_file();
  f.b[0] = 'X';
  expect_error(f, "wrong magic");
  f = good_file();
  f.b[4] = 1;
  expect_error(f, "version 1");
  f = good_file();
  std::swap(f.b[4], f.b[7]);  // a big-endian writer's 3
  expect_error(f, "is not supported");
}

TEST(GgufFile, OffsetsPastTheEndOverlapAndMisalignment) {
  expect_error(good_file(128), "runs past the end");
  expect_error(good_file(0), "overlap");
  expect_error(good_file(32), "not a multiple of the alignment");
}

TEST(GgufFile, UnknownTensorTypeIsNamed) {
  auto g = parse(good_file(64, 20));  // IQ4_NL: a ggml type this engine does not read
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("tensor 'b' has ggml type 20"), std::string::npos) << g.status().to_string();
  EXPECT_NE(g.status().message().find("not the IQ* / TQ* types"), std::string::npos) << g.status().to_string();
  EXPECT_NE(g.status().message().find("--weights q4_k|q8_0"), std::string::npos) << g.status().to_string();
}

TEST(GgufFile, BadAlignment) { expect_error(good_file(64, 0, 48), "power of two"); }

TEST(GgufFile, AbsurdCountsAndLengths) {
  Bytes f = good_file();
  std::memset(f.b.data() + 8, 0xff, 8);  // tensor count
  expect_error(f, "tensor count");
  f = good_file();
  std::memset(f.b.data() + 16, 0x7f, 8);  // metadata count
  expect_error(f, "metadata count");
  f = good_file();
  std::memset(f.b.data() + 24, 0x7f, 8);  // the first key's length
  expect_error(f, "metadata key 0");
  // An array claiming 2^60 elements.
  Bytes a;
  a.b = {'G', 'G', 'U', 'F'};
  a.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  a.str("big").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 60);
  expect_error(a, "more than the file holds");
  // An array of 2^24 + 1 one-byte elements (the file holds them): over the per-array limit.
  Bytes wide;
  wide.b = {'G', 'G', 'U', 'F'};
  wide.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  wide.str("wide").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(kMaxGgufArrayElements + 1);
  wide.b.resize(wide.b.size() + kMaxGgufArrayElements + 1);
  expect_error(wide, "over the limit");
  // 2^16 + 1 empty arrays inside one array (12 file bytes each, a GgufValue each in memory).
  Bytes nested;
  nested.b = {'G', 'G', 'U', 'F'};
  nested.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  nested.str("nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(kMaxGgufNestedArrays + 1);
  for (uint64_t k = 0; k <= kMaxGgufNestedArrays; ++k) nested.put<uint32_t>(4).put<uint64_t>(0);
  expect_error(nested, "nests more than");
  // A dimension of zero and five dimensions.
  Bytes d;
  d.b = {'G', 'G', 'U', 'F'};
  d.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0);
  tensor_info(d, "z", {0}, 0, 0);
  d.pad_to(32).b.resize(d.b.size() + 64);
  expect_error(d, "zero or absurd");
  Bytes five;
  five.b = {'G', 'G', 'U', 'F'};
  five.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0);
  tensor_info(five, "five", {1, 1, 1, 1, 1}, 0, 0);
  five.pad_to(32).b.resize(five.b.size() + 64);
  expect_error(five, "5 dimensions");
}

TEST(GgufFile, UnknownValueTypeAndDuplicates) {
  Bytes f;
  f.b = {'G', 'G', 'U', 'F'};
  f.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  f.str("weird").put<uint32_t>(13).put<uint32_t>(0);
  expect_error(f, "unknown value type 13");
  Bytes dup;
  dup.b = {'G', 'G', 'U', 'F'};
  dup.put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(2);
  dup.str("x").put<uint32_t>(4).put<uint32_t>(1).str("x").put<uint32_t>(4).put<uint32_t>(2);
  expect_error(dup, "appears twice");
  Bytes tdup;
  tdup.b = {'G', 'G', 'U', 'F'};
  tdup.put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(0);
  tensor_info(tdup, "t", {8}, 0, 0);
  tensor_info(tdup, "t", {8}, 0, 32);
  tdup.pad_to(32).b.resize(tdup.b.size() + 64);
  expect_error(tdup, "tensor 't' appears twice");
}

TEST(GgufFile, QuantizedColumnsMustFillBlocks) {
  Bytes f;
  f.b = {'G', 'G', 'U', 'F'};
  f.put<uint32_t>(3).put<uint64_t>(1).put<uint64_t>(0);
  tensor_info(f, "q", {48, 1}, 8, 0);  // Q8_0 needs a multiple of 32
  f.pad_to(32).b.resize(f.b.size() + 68);
  expect_error(f, "not a multiple of its block of 32");
}

TEST(GgufFile, TypedGettersNameTheKey) {
  test::TempDir dir("getters");
  test::write_bytes(dir.file("g.gguf"), good_file().b);
  auto f = GgufFile::open(dir.file("g.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(*f->get_int("k.u32"), 4000000000LL);
  EXPECT_EQ(*f->get_float("k.f32"), 0.25);
  EXPECT_EQ(*f->get_string("general.architecture"), "dream");
  EXPECT_EQ(*f->get_int_or("absent", 7), 7);
  auto bad = f->get_int("k.f32");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'k.f32' is a float32"), std::string::npos) << bad.status().to_string();
  auto missing = f->get_string("dream.block_count");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'dream.block_count' is missing"), std::string::npos);
  EXPECT_NE(f->find_tensor("b"), nullptr);
  EXPECT_EQ(f->find_tensor("c"), nullptr);
}

TEST(GgufFile, FuzzSeedParses) {
  auto f = GgufFile::open(std::string(DC_SOURCE_DIR) + "/tests/fuzz/seeds/gguf/tiny.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].type, GgufType::kQ8_0);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->strings[1], "b");
}

}  // namespace
}  // namespace dc
