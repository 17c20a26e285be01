// ScratchBuffer: a grow-only 64-byte-aligned buffer, for per-thread (thread_local) kernel scratch that
// is reused across calls instead of allocated on every call.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace dc::cpu {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer() { std::free(data_); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  // At least `bytes` bytes, 64-byte aligned; the contents are undefined after a call that grows.
  template <typename T>
  T* get(size_t count) {
    const size_t bytes = (count * sizeof(T) + 63) & ~size_t{63};
    if (bytes > size_) {
      std::free(data_);
      data_ = std::aligned_alloc(64, bytes);
      if (data_ == nullptr) throw std::bad_alloc();
      size_ = bytes;
    }
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dc::cpu
