// Large buffers that the sandbox's clone does not copy: each in an anonymous mapping of its own, which is
// advised MADV_DONTFORK while a PagesLeftBehind lives (the sandbox holds one around its clone:
// sandbox/sandbox.cc), so that the clone of a big trainer or server neither copies their page tables nor
// makes every write to them a copy-on-write fault while a run lives. Smaller ones come from malloc, as
// before. See docs/ARCHITECTURE.md "Memory a fork does not copy".
//
// Any other fork (Python's multiprocessing "fork" start method) carries them as ordinary memory, unless it
// happens on another thread during a sandbox's clone (a few microseconds); DONTFORK, not WIPEONFORK, so
// such a child touching them crashes, never reads silent zeros.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace dc {

// From this size on a buffer gets its own mapping (and the advice); below it, malloc.
inline constexpr size_t kOwnMappingBytes = size_t{1} << 20;

// `bytes` of uninitialised memory, freed with free_pages(p, bytes) (the same `bytes`). From
// kOwnMappingBytes on: its own mapping (advised MADV_DONTFORK while a PagesLeftBehind lives), and from 2 MiB on 2 MiB-aligned and advised
// as transparent huge pages (fewer page faults while it is filled, fewer TLB misses while it is streamed);
// below: std::aligned_alloc, 64-byte aligned. nullptr when memory runs out. Thread-safe.
void* alloc_pages(size_t bytes);
// Frees what alloc_pages(bytes) returned (nullptr: nothing). Thread-safe.
void free_pages(void* p, size_t bytes);

// While one lives (in any thread), every large buffer of alloc_pages, those allocated meanwhile included,
// is advised MADV_DONTFORK: a clone made meanwhile does not carry them. The last one to go undoes the
// advice. Thread-safe; cost: two madvise calls per large buffer per outermost holder.
class PagesLeftBehind {
 public:
  PagesLeftBehind();
  ~PagesLeftBehind();
  PagesLeftBehind(const PagesLeftBehind&) = delete;
  PagesLeftBehind& operator=(const PagesLeftBehind&) = delete;
};

// unique_ptr's deleter of alloc_pages' memory: knows the size it was asked for.
struct PagesDeleter {
  size_t bytes = 0;
  void operator()(void* p) const { free_pages(p, bytes); }
};
template <typename T>
using PageArray = std::unique_ptr<T[], PagesDeleter>;  // [bytes / sizeof(T)]

// A PageArray of `bytes` bytes (uninitialised); empty when memory runs out.
template <typename T>
PageArray<T> alloc_page_array(size_t bytes) {
  return PageArray<T>(static_cast<T*>(alloc_pages(bytes)), PagesDeleter{bytes});
}

// The standard allocator interface over alloc_pages, for the std::vectors that grow large (the
// workspace's named buffers, the saved activations): `std::vector<float, PageAllocator<float>>`.
template <typename T>
struct PageAllocator {
  using value_type = T;
  PageAllocator() = default;
  template <typename U>
  PageAllocator(const PageAllocator<U>&) {}  // NOLINT: converting, as std::allocator's
  T* allocate(size_t n) {
    void* p = alloc_pages(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) { free_pages(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const PageAllocator<U>&) const {
    return true;
  }
};

}  // namespace dc
