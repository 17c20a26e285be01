// Workspace: reusable scratch memory owned by whoever owns the Context it is passed in (an Engine's
// generation, a Trainer) instead of thread_local globals: named f32 buffers grown to the largest request,
// per-thread buffers for the kernels' blocks, all kept for the next call and freed by release().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/pages.h"

namespace dc {

class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // The buffer called `name`, grown to at least `count` floats (never shrunk; contents unspecified).
  // Throws std::bad_alloc when memory runs out (Model::forward / backward turn it into a Status). The
  // pointer stays valid until the next call with the same name that grows it, or release(). One thread
  // at a time.
  float* floats(std::string_view name, int64_t count);

  // The calling thread's own buffer called `name` (keyed by ThreadPool::thread_index(), so the threads
  // of one parallel_for never share one): at least count · sizeof(T) bytes, 64-byte aligned, contents
  // unspecified, grown to the largest request. The threads of one parallel_for may call it at once.
  // Throws std::bad_alloc. Valid until the same thread asks for `name` bigger, or release().
  template <typename T>
  T* thread_buffer(std::string_view name, size_t count) {
    return static_cast<T*>(thread_bytes(name, count * sizeof(T)));
  }

  // Frees every buffer (e.g. after a large backward); later calls grow them again. Not during a call.
  void release();

  // Bytes held now.
  int64_t bytes() const;

 private:
  struct Aligned {  // a 64-byte-aligned block from std::aligned_alloc
    std::string name;
    void* data = nullptr;
    size_t size = 0;
  };
  using ThreadBuffers = std::vector<Aligned>;  // one thread's, few names: a linear search
  void* thread_bytes(std::string_view name, size_t bytes);

  // Few names: a linear search. The large ones are not copied by a fork (core/pages.h).
  std::vector<std::pair<std::string, std::vector<float, PageAllocator<float>>>> bufs_;
  mutable std::mutex threads_mu_;  // guards the growth of threads_ (each thread then uses its own entry)
  std::vector<std::unique_ptr<ThreadBuffers>> threads_;  // [thread index]
};

}  // namespace dc
