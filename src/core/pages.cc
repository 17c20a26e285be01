// alloc_pages / free_pages: big buffers in mappings of their own, left behind by the clones made while a
// PagesLeftBehind lives.
#include "core/pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace dc {

namespace {

constexpr size_t kHuge = size_t{2} << 20;
constexpr size_t kPage = 4096;  // the smallest page of the kernels we run on (larger ones: mmap rounds)

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The alignment of a large buffer's mapping, its start and its length.
size_t alignment_of(size_t bytes) { return bytes >= kHuge ? kHuge : kPage; }

// The large buffers that live (start → mapped length) and how many PagesLeftBehind hold the advice.
struct Registry {
  std::mutex mu;
  std::unordered_map<void*, size_t> mappings;
  int holders = 0;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: buffers may be freed by static destructors
  return *r;
}

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
  if (align == kHuge) ::madvise(p, len, MADV_HUGEPAGE);  // advice only
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.holders > 0) ::madvise(p, len, MADV_DONTFORK);  // (a failure only costs a clone its copy)
  r.mappings.emplace(p, len);
  return p;
}

void free_pages(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kOwnMappingBytes) return std::free(p);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.mappings.erase(p);
  }
  ::munmap(p, round_up(bytes, alignment_of(bytes)));
}

PagesLeftBehind::PagesLeftBehind() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.holders++ == 0)
    for (const auto& [p, len] : r.mappings) ::madvise(p, len, MADV_DONTFORK);
}

PagesLeftBehind::~PagesLeftBehind() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (--r.holders == 0)
    for (const auto& [p, len] : r.mappings) ::madvise(p, len, MADV_DOFORK);
}

}  // namespace dc
