// MappedFile: a whole file mapped read-only into memory (RAII; the mapping lives as long as the
// object), plus a small helper that reads a text file into a string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace dc {

class MappedFile {
 public:
  // Maps the regular file at `path` read-only and private. A zero-length file gives size() == 0 and
  // data() == nullptr (nothing is mapped). Errors (missing file, a directory, mmap failure) name the
  // path and the errno text. The file descriptor is closed before returning; the mapping stays.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The mapped bytes; stable for the lifetime of the mapping, including across moves.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Hands the pages lying wholly inside [p, p + bytes) back to the kernel (madvise MADV_DONTNEED): for a
// private file mapping they are re-read from the file if touched again, for anonymous memory they read
// as zeros. For weights that have been copied elsewhere and will not be read again.
void release_pages(const void* p, size_t bytes);

// The default size limit of read_text_file (config.json and the like are a few KB).
inline constexpr int64_t kMaxTextFileBytes = int64_t{64} << 20;

// Reads the whole regular file at `path` (config.json and the like), at most `max_bytes` (else
// kOutOfRange, before reading). Errors name the path and errno text; a missing file gives kNotFound;
// a directory, FIFO or device is refused without blocking.
Result<std::string> read_text_file(const std::string& path, int64_t max_bytes = kMaxTextFileBytes);

}  // namespace dc
