// alloc_pages / free_pages: big buffers in mappings of their own that a fork does not copy.
#include "core/pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace dc {

namespace {

constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kPage = 4096;  // the smallest page of the kernels we run on (larger ones: mmap rounds)

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The alignment of a large buffer's mapping, its start and its length.
size_t alignment_of(size_t bytes) { return bytes >= kHuge ? kHuge : kPage; }

}  // namespace

void* alloc_pages(size_t bytes) {
  if (bytes < kOwnMappingBytes) return std::aligned_alloc(64, round_up(std::max<size_t>(bytes, 1), 64));
  const size_t align = alignment_of(bytes), len = round_up(bytes, align);
  // Over-map by the alignment and trim both ends, so the buffer starts on a huge-page boundary.
  const size_t over = align > kPage ? len + align : len;
  void* raw = ::mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = round_up(base, align);
  if (start > base) ::munmap(raw, start - base);
  if (base + over > start + len) ::munmap(reinterpret_cast<void*>(start + len), base + over - (start + len));
  void* p = reinterpret_cast<void*>(start);
  // Not advice we may lose: without it every fork copies the buffer's page tables (see pages.h).
  if (::madvise(p, len, MADV_DONTFORK) != 0) {
    ::munmap(p, len);
    return nullptr;
  }
  if (align == kHuge) ::madvise(p, len, MADV_HUGEPAGE);  // advice only
  return p;
}

void free_pages(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kOwnMappingBytes) return std::free(p);
  const size_t align = alignment_of(bytes);
  ::munmap(p, round_up(bytes, align));
}

}  // namespace dc
