// MappedFile and read_text_file: contents, empty files, moves, and errors that name the path.
#include "io/mapped_file.h"

#include <gtest/gtest.h>

#include <cstring>

#include "io/io_test_util.h"

namespace dc {
namespace {

using dc::test::TempDir;
using dc::testing::write_bytes;

TEST(MappedFile, MapsTheWholeFile) {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  write_bytes(path, std::string("hello\0world", 11));
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->size(), 11u);
  EXPECT_EQ(file->path(), path);
  ASSERT_NE(file->data(), nullptr);
  EXPECT_EQ(std::memcmp(file->data(), "hello\0world", 11), 0);
}

TEST(MappedFile, EmptyFileHasNoData) {
  TempDir dir;
  const std::string path = dir.file("empty");
  write_bytes(path, "");
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->size(), 0u);
  EXPECT_EQ(file->data(), nullptr);
}

TEST(MappedFile, MoveKeepsTheMapping) {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  write_bytes(path, "abcdef");
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.ok());
  const uint8_t* data = file->data();
  MappedFile moved = std::move(file).value();
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.size(), 6u);
  MappedFile assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), data);
  EXPECT_EQ(moved.data(), nullptr);  // NOLINT: checking the moved-from state on purpose
  EXPECT_EQ(std::memcmp(assigned.data(), "abcdef", 6), 0);
}

TEST(MappedFile, MissingFileNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  auto file = MappedFile::open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status().message();
  EXPECT_NE(file.status().message().find("No such file"), std::string::npos) << file.status().message();
}

TEST(MappedFile, DirectoryIsRejected) {
  TempDir dir;
  auto file = MappedFile::open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find(dir.path()), std::string::npos) << file.status().message();
  EXPECT_NE(file.status().message().find("not a regular file"), std::string::npos) << file.status().message();
}

TEST(ReadTextFile, ReadsAndReportsMissing) {
  TempDir dir;
  write_bytes(dir.file("c.json"), "{\"a\": 1}\n");
  auto text = read_text_file(dir.file("c.json"));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "{\"a\": 1}\n");
  auto empty_path = dir.file("e.json");
  write_bytes(empty_path, "");
  auto empty = read_text_file(empty_path);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
  auto missing = read_text_file(dir.file("m.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("m.json"), std::string::npos);
}

}  // namespace
}  // namespace dc
