// Safetensors: writer/reader round trips for every dtype, metadata, atomic writes, and each kind of
// malformed file rejected with a message naming the file and the tensor or field.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>

#include "io/io_test_util.h"

namespace dc {
namespace {

using dc::testing::safetensors_bytes;
using dc::test::TempDir;
using dc::testing::expect_error;
using dc::testing::write_bytes;

std::vector<uint8_t> pattern_bytes(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed * 7 + 1);
  return v;
}

size_t byte_count(DType dtype, const std::vector<int64_t>& shape) {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// ---- round trips -----------------------------------------------------------------------------------

class SafetensorsRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsRoundTrip, ShapesAndBytesSurvive) {
  const DType dtype = GetParam();
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {3}, {2, 3}, {2, 3, 5}, {4, 0, 2}, {7, 1, 1, 3}};
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < shapes.size(); ++i) {
    data.push_back(pattern_bytes(byte_count(dtype, shapes[i]), static_cast<int>(i)));
    tensors.push_back({"layer." + std::to_string(i) + ".weight", dtype, shapes[i], data.back().data()});
  }
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->tensors().size(), shapes.size());
  EXPECT_TRUE(file->metadata().empty());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const TensorInfo* t = file->find(tensors[i].name);
    ASSERT_NE(t, nullptr) << tensors[i].name;
    EXPECT_EQ(t->name, tensors[i].name);
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, shapes[i]);
    EXPECT_EQ(t->file, path);
    ASSERT_EQ(t->n_bytes, data[i].size());
    if (t->n_bytes > 0) {
      EXPECT_EQ(std::memcmp(t->data, data[i].data(), t->n_bytes), 0) << t->name;
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % dtype_size(dtype), 0u) << t->name << " is unaligned";
  }
  EXPECT_EQ(file->find("absent"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SafetensorsRoundTrip, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Safetensors, MixedDTypesAreAlignedAndParseAsWritten) {
  TempDir dir;
  const std::string path = dir.file("mixed.safetensors");
  const auto a = pattern_bytes(3 * 2, 1);   // BF16 [3]: 6 bytes, would misalign a following F32
  const auto b = pattern_bytes(5 * 4, 2);   // F32 [5]
  const auto c = pattern_bytes(1 * 2, 3);   // F16 [1]
  ASSERT_TRUE(write_safetensors(path, {{"a", DType::kBF16, {3}, a.data()},
                                       {"b", DType::kF32, {5}, b.data()},
                                       {"c", DType::kF16, {1}, c.data()}})
                  .ok());
  auto mapped = MappedFile::open(path);
  ASSERT_TRUE(mapped.ok());
  auto parsed = parse_safetensors(mapped->data(), mapped->size(), path);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->buffer_offset % 8, 0u);
  for (const auto& [name, t] : parsed->tensors) {
    EXPECT_EQ((static_cast<const uint8_t*>(t.data) - mapped->data()) % dtype_size(t.dtype), 0u) << name;
  }
  EXPECT_EQ(std::memcmp(parsed->tensors.at("b").data, b.data(), b.size()), 0);
  EXPECT_EQ(std::memcmp(parsed->tensors.at("a").data, a.data(), a.size()), 0);
  EXPECT_EQ(mapped->size(), parsed->buffer_offset + a.size() + b.size() + c.size());
}

TEST(Safetensors, MetadataRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const float x[2] = {1.5f, -2.0f};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "üñí \"quoted\""}, {"empty", ""}};
  ASSERT_TRUE(write_safetensors(path, {{"x", DType::kF32, {2}, x}}, metadata).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->metadata(), metadata);
  EXPECT_EQ(file->tensors().count("__metadata__"), 0u);
  const float* got = static_cast<const float*>(file->find("x")->data);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.0f);
}

TEST(Safetensors, EmptyFileOfTensorsRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("none.safetensors");
  ASSERT_TRUE(write_safetensors(path, {}).ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_TRUE(file->tensors().empty());
}

TEST(Safetensors, WriterLeavesNoTemporaryFileAndOverwrites) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const uint16_t v1[1] = {0x3f80}, v2[2] = {0x4000, 0x4040};
  ASSERT_TRUE(write_safetensors(path, {{"v", DType::kBF16, {1}, v1}}).ok());
  ASSERT_TRUE(write_safetensors(path, {{"v", DType::kBF16, {2}, v2}}).ok());
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.safetensors"});
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->find("v")->shape, std::vector<int64_t>{2});
}

TEST(Safetensors, WriterRejectsBadInputAndKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const float v[2] = {1, 2};
  ASSERT_TRUE(write_safetensors(path, {{"keep", DType::kF32, {2}, v}}).ok());
  expect_error(write_safetensors(path, {{"a", DType::kF32, {2}, v}, {"a", DType::kF32, {1}, v}}),
               {path, "'a'", "twice"});
  expect_error(write_safetensors(path, {{"", DType::kF32, {1}, v}}), {path, "name"});
  expect_error(write_safetensors(path, {{"__metadata__", DType::kF32, {1}, v}}), {path, "__metadata__"});
  expect_error(write_safetensors(path, {{"neg", DType::kF32, {2, -1}, v}}), {path, "'neg'", "negative"});
  expect_error(write_safetensors(path, {{"null", DType::kF32, {2}, nullptr}}), {path, "'null'", "nullptr"});
  expect_error(write_safetensors(path, {{"huge", DType::kF32, {int64_t{1} << 40, int64_t{1} << 30}, v}}),
               {path, "'huge'", "overflows"});
  expect_error(write_safetensors(path, {{"bad\xff", DType::kF32, {1}, v}}), {path, "UTF-8"});
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.safetensors"});
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_NE(file->find("keep"), nullptr);
}

TEST(Safetensors, WriterIntoMissingDirectoryFails) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/x.safetensors");
  const float v[1] = {1};
  expect_error(write_safetensors(path, {{"x", DType::kF32, {1}, v}}), {"x.safetensors.tmp."});
  EXPECT_TRUE(dir.list().empty());
}

// ---- malformed files -------------------------------------------------------------------------------

// Writes `bytes` to a file and opens it as safetensors.
class SafetensorsBadInput : public ::testing::Test {
 protected:
  Status open_bytes(const std::string& bytes) {
    write_bytes(path_, bytes);
    return SafetensorsFile::open(path_).status();
  }
  Status open_header(const std::string& header, const std::string& buffer = std::string(16, '\0')) {
    return open_bytes(safetensors_bytes(header, buffer));
  }
  TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(SafetensorsBadInput, MissingFile) {
  auto file = SafetensorsFile::open(dir_.file("missing.safetensors"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  expect_error(file.status(), {"missing.safetensors"});
}

TEST_F(SafetensorsBadInput, EmptyAndTooShortFiles) {
  expect_error(open_bytes(""), {path_, "0 bytes", "too short"});
  expect_error(open_bytes("1234567"), {path_, "7 bytes"});
}

TEST_F(SafetensorsBadInput, HeaderLengthPastTheEnd) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error(open_bytes(safetensors_bytes(header, "", header.size() + 100)), {path_, "header length", "truncated"});
  expect_error(open_bytes(safetensors_bytes(header, "", 1ull << 40)), {path_, "header length", "limit"});
  expect_error(open_bytes(safetensors_bytes(header, "", UINT64_MAX - 1)), {path_, "header length"});
}

TEST_F(SafetensorsBadInput, HeaderNotJsonOrNotAnObject) {
  expect_error(open_header("this is not json"), {path_, "not valid JSON"});
  expect_error(open_header(R"({"a": {"dtype": "F32",)"), {path_, "not valid JSON"});
  expect_error(open_header(std::string("{\"a\0\": 1}", 10)), {path_, "not valid JSON"});
  expect_error(open_header("[1, 2, 3]"), {path_, "JSON object", "array"});
  expect_error(open_header("42"), {path_, "JSON object", "number"});
  expect_error(open_header(""), {path_, "not valid JSON"});
}

TEST_F(SafetensorsBadInput, EntryNotAnObject) {
  expect_error(open_header(R"({"w": [1, 2]})"), {path_, "'w'", "JSON object"});
}

TEST_F(SafetensorsBadInput, MissingFields) {
  expect_error(open_header(R"({"w":{"shape":[1],"data_offsets":[0,4]}})"), {path_, "'w'", "dtype"});
  expect_error(open_header(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})"), {path_, "'w'", "shape"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1]}})"), {path_, "'w'", "data_offsets"});
}

TEST_F(SafetensorsBadInput, WrongFieldTypes) {
  expect_error(open_header(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})"), {path_, "'w'", "dtype"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})"), {path_, "'w'", "shape"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})"), {path_, "'w'", "shape"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})"), {path_, "'w'", "shape"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})"), {path_, "'w'", "data_offsets"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})"),
               {path_, "'w'", "data_offsets"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})"),
               {path_, "'w'", "data_offsets"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":{"a":0}}})"),
               {path_, "'w'", "data_offsets"});
}

TEST_F(SafetensorsBadInput, UnknownAndUnsupportedDTypes) {
  Status unknown = open_header(R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,4]}})");
  expect_error(unknown, {path_, "'w'", "unknown dtype", "Q4_K"});
  EXPECT_EQ(unknown.code(), StatusCode::kParseError);
  Status unsupported = open_header(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})");
  expect_error(unsupported, {path_, "'ids'", "I64", "not supported"});
  EXPECT_EQ(unsupported.code(), StatusCode::kUnimplemented);
}

TEST_F(SafetensorsBadInput, SizeMismatch) {
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})"),
               {path_, "'w'", "12 bytes", "16 bytes"});
  expect_error(open_header(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,12]}})"), {path_, "'w'", "6 bytes"});
}

TEST_F(SafetensorsBadInput, ElementCountOverflow) {
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})"),
               {path_, "'w'", "overflow"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})"),
               {path_, "'w'", "overflow"});
}

TEST_F(SafetensorsBadInput, OffsetsOutOfRange) {
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})"),
               {path_, "'w'", "past the end", "16 bytes"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})"),
               {path_, "'w'", "past the end"});
  expect_error(open_header(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})"), {path_, "'w'", "begin > end"});
}

TEST_F(SafetensorsBadInput, OverlappingTensors) {
  expect_error(open_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                               "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
               {path_, "'a'", "'b'", "overlap"});
  expect_error(open_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                               "b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})"),
               {path_, "'a'", "'b'", "overlap"});
}

TEST_F(SafetensorsBadInput, DuplicateKeys) {
  expect_error(open_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                               "a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
               {path_, "'a'", "twice"});
  expect_error(open_header(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})"),
               {path_, "'dtype'", "twice"});
}

TEST_F(SafetensorsBadInput, BadMetadata) {
  expect_error(open_header(R"({"__metadata__":{"format":1}})"), {path_, "__metadata__", "'format'", "string"});
  expect_error(open_header(R"({"__metadata__":["pt"]})"), {path_, "__metadata__", "object"});
}

TEST(SafetensorsAccepts, HolesZeroSizedTensorsPaddingAndNullMetadata) {
  TempDir dir;
  const std::string path = dir.file("ok.safetensors");
  // [12, 16) is a hole; "e" and "z" are empty and may sit anywhere; trailing spaces pad the header.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[8,12]},)"
                             R"("b":{"dtype":"F16","shape":[2],"data_offsets":[16,20]},)"
                             R"("e":{"dtype":"BF16","shape":[0,3],"data_offsets":[4,4]},)"
                             R"("z":{"dtype":"F32","shape":[0],"data_offsets":[20,20]},)"
                             R"("__metadata__":null}    )";
  write_bytes(path, safetensors_bytes(header, std::string(20, 'x')));
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->tensors().size(), 5u);
  EXPECT_TRUE(file->metadata().empty());
  EXPECT_EQ(file->find("e")->n_bytes, 0u);
  EXPECT_EQ(file->find("e")->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(file->find("scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ(file->find("scalar")->n_bytes, 4u);
}

TEST(SafetensorsParse, FromMemoryNamesThePathGiven) {
  const std::string bytes =
      safetensors_bytes(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  auto parsed = parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem://x");
  expect_error(parsed.status(), {"mem://x", "'w'", "F64"});
}

}  // namespace
}  // namespace dc
