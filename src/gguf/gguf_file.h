// GGUF (ggml's single-file model format, versions 2 and 3, little-endian): a validating memory-mapped
// reader. Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count, the key/value pairs, the
// tensor infos (name, u32 n_dims, u64 dims innermost first, u32 type, u64 offset), padding to
// general.alignment (default 32), then the data section the offsets are relative to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/mapped_file.h"

namespace dc {

// The tensor types this engine reads (ggml's type ids; the quantized ones are ops' cpu::GgmlType, run in
// place by the matmul kernels); any other id (IQ*, TQ*, Q8_1, Q8_K, ...) is refused by name.
enum class GgufType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
  kQ5_K = 13, kQ6_K = 14, kBF16 = 30,
};

// A block of `block` elements takes `bytes` bytes (1 element for the float types).
struct GgufTypeInfo {
  const char* name;
  int64_t block;
  int64_t bytes;
};
// nullopt for a type id this engine does not read.
std::optional<GgufTypeInfo> gguf_type_info(uint32_t type);

// Metadata value types, as in the file.
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9,
  kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// One metadata value. Integers are widened into `i` (signed types, and unsigned ones up to 2^63 − 1;
// a larger u64 is refused at parse time), floats into `f`, booleans into `i` (0 / 1). Strings and
// arrays of strings are views into the mapped file. Arrays of numbers keep their raw little-endian
// elements (`raw`, `n` of them, type `elem`); arrays of arrays keep their items in `items`.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  int64_t i = 0;
  double f = 0;
  std::string_view s;
  GgufValueType elem = GgufValueType::kU8;  // arrays
  uint64_t n = 0;                           // arrays: element count
  const uint8_t* raw = nullptr;             // arrays of numbers / bools
  std::vector<std::string_view> strings;    // arrays of strings
  std::vector<GgufValue> items;             // arrays of arrays

  bool is_integer() const;  // an integer type or bool
  bool is_float() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
  // Element k of an array of integers (or bools) as int64; k < n.
  int64_t int_at(uint64_t k) const;
};

struct GgufTensor {
  std::string name;
  GgufType type = GgufType::kF32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) dimension
  uint64_t offset = 0;        // relative to the data section
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
};

// Limits on what a file may declare, checked before anything is sized by it.
inline constexpr uint64_t kMaxGgufTensors = 1u << 20;
inline constexpr uint64_t kMaxGgufMetadata = 1u << 20;
inline constexpr uint64_t kMaxGgufStringBytes = uint64_t{1} << 26;
inline constexpr int kMaxGgufArrayDepth = 8;
// Elements of one array, and nested arrays in the whole file (each costs a GgufValue in memory, ~12x its
// bytes in the file); a 152k-token vocabulary is far below both.
inline constexpr uint64_t kMaxGgufArrayElements = uint64_t{1} << 24;
inline constexpr uint64_t kMaxGgufNestedArrays = uint64_t{1} << 16;
inline constexpr uint32_t kMaxGgufDims = 4;

// A parsed GGUF image. The views point into the bytes given to parse_gguf (or the file's mapping).
struct ParsedGguf {
  uint32_t version = 0;
  uint64_t alignment = 32;
  size_t data_offset = 0;  // where the data section starts in the file
  std::map<std::string, GgufValue, std::less<>> metadata;
  std::vector<GgufTensor> tensors;  // in file order
  std::map<std::string, size_t, std::less<>> by_name;  // index into tensors
};

// Parses and validates [bytes, bytes + size): magic, version 2 or 3, counts against the limits and the
// bytes left, every string / array length inside the file, value types known, no duplicate keys or
// tensor names, general.alignment a u32 power of two, every tensor of a known type with 1..4 positive
// dims whose innermost is a multiple of its block size, offsets multiples of the alignment, data inside
// the file and no two tensors overlapping. Errors name `path`, the key or tensor and the byte offset.
Result<ParsedGguf> parse_gguf(const uint8_t* bytes, size_t size, const std::string& path);

// A memory-mapped, validated GGUF file. Movable (views stay valid), not copyable; const methods are
// thread-safe.
class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<GgufTensor>& tensors() const { return parsed_.tensors; }
  // nullptr when absent.
  const GgufValue* find(std::string_view key) const;
  const GgufTensor* find_tensor(std::string_view name) const;

  // Typed reads of a metadata key; errors name the file and the key (missing, or of another type).
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;  // f32 / f64 (or an integer)
  Result<std::string_view> get_string(std::string_view key) const;
  // A key's integer value, or `fallback` when absent; an error when present with another type.
  Result<int64_t> get_int_or(std::string_view key, int64_t fallback) const;

 private:
  MappedFile file_;
  ParsedGguf parsed_;
};

}  // namespace dc
