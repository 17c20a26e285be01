// Workspace: named buffers and the per-thread kernel buffers.
#include "core/workspace.h"

#include <cstdlib>
#include <new>

#include "core/thread_pool.h"

namespace dc {

Workspace::~Workspace() { release(); }

float* Workspace::floats(std::string_view name, int64_t count) {
  std::vector<float, PageAllocator<float>>* buf = nullptr;
  for (auto& [n, b] : bufs_)
    if (n == name) buf = &b;
  if (buf == nullptr) buf = &bufs_.emplace_back(std::string(name), std::vector<float, PageAllocator<float>>()).second;
  if (static_cast<int64_t>(buf->size()) < count) buf->resize(static_cast<size_t>(count));
  return buf->data();
}

void* Workspace::thread_bytes(std::string_view name, size_t bytes) {
  const size_t index = static_cast<size_t>(ThreadPool::thread_index());
  ThreadBuffers* mine;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (threads_.size() <= index) threads_.resize(index + 1);
    if (!threads_[index]) threads_[index] = std::make_unique<ThreadBuffers>();
    mine = threads_[index].get();
  }
  Aligned* buf = nullptr;
  for (Aligned& b : *mine)
    if (b.name == name) buf = &b;
  if (buf == nullptr) buf = &mine->emplace_back(Aligned{std::string(name), nullptr, 0});
  if (buf->size < bytes) {
    const size_t size = (bytes + 63) & ~size_t{63};
    std::free(buf->data);
    buf->data = std::aligned_alloc(64, size);
    buf->size = buf->data != nullptr ? size : 0;
    if (buf->data == nullptr) throw std::bad_alloc();
  }
  return buf->data;
}

void Workspace::release() {
  bufs_.clear();
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (auto& mine : threads_)
    if (mine)
      for (Aligned& b : *mine) std::free(b.data);
  threads_.clear();
}

int64_t Workspace::bytes() const {
  int64_t total = 0;
  for (const auto& [n, b] : bufs_) total += static_cast<int64_t>(b.capacity() * sizeof(float));
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (const auto& mine : threads_)
    if (mine)
      for (const Aligned& b : *mine) total += static_cast<int64_t>(b.size);
  return total;
}

}  // namespace dc
