// The safetensors format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the byte
// buffer (offsets are relative to its start). A validating memory-mapped reader and an atomic writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/mapped_file.h"

namespace dc {

// One tensor of a safetensors file. `data` points into the file's read-only mapping (no copy) and is
// valid while the owning SafetensorsFile / Checkpoint lives (moves keep it valid). The bytes are
// little-endian, row-major; `data` may be unaligned if the writer did not align its offsets.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // [] for a scalar
  const void* data = nullptr;
  size_t n_bytes = 0;           // product(shape) * dtype_size(dtype)
  std::string file;             // the path of the file that holds it, for error messages
};

// The largest header accepted (the same limit as the reference implementation).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// What a safetensors header describes.
struct ParsedSafetensors {
  std::map<std::string, TensorInfo> tensors;    // by name
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  size_t buffer_offset = 0;                     // where the byte buffer starts (8 + N)
};

// Parses and validates the safetensors bytes [bytes, bytes + size): header length sane, the header a
// JSON object without duplicate keys, every entry an object with a supported dtype (F32, F16, BF16, and
// I8 / U8 for quantized weight codes; other safetensors dtypes give kUnimplemented naming the tensor),
// a shape of non-negative integers and data_offsets [begin, end] inside the buffer with end - begin ==
// elements * dtype size, no two tensors overlapping, and __metadata__ a map of strings.
// TensorInfo::data points into `bytes`, so the caller keeps them alive. `path` is only used in messages. Thread-safe (no shared state).
Result<ParsedSafetensors> parse_safetensors(const uint8_t* bytes, size_t size, const std::string& path);

// A memory-mapped, validated safetensors file. Movable, not copyable.
class SafetensorsFile {
 public:
  // Maps `path` and validates it as parse_safetensors does. Errors name the path (and the tensor).
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  size_t file_size() const { return file_.size(); }
  const std::map<std::string, TensorInfo>& tensors() const { return parsed_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return parsed_.metadata; }
  // nullptr when the file has no tensor called `name`.
  const TensorInfo* find(std::string_view name) const;

 private:
  MappedFile file_;
  ParsedSafetensors parsed_;
};

// A tensor to write: `data` holds product(shape) * dtype_size(dtype) bytes in host (little-endian)
// order; it may be nullptr when that count is zero. The caller keeps it alive during the call.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `tensors` (unique, non-empty names other than "__metadata__"; non-negative dims) and
// `metadata` to `path` as safetensors. The tensors are laid out by element size (largest first), then
// by name, so every tensor's offset is a multiple of its element size; the header is padded with
// spaces so the buffer starts at a multiple of 8. Atomic: the bytes go to `path.tmp.<pid>` in the same
// directory, which is fsynced and renamed over `path`, then the directory is fsynced; on failure the
// temporary file is removed and `path` is untouched. Not safe to call concurrently on the same path
// from one process.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace dc
