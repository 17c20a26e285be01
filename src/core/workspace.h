// Workspace: reusable scratch memory owned by whoever owns the Context it is passed in (an Engine's
// generation, a Trainer) instead of thread_local globals: named f32 buffers grown to the largest request,
// kept for the next call, and freed by release().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dc {

class Workspace {
 public:
  // The buffer called `name`, grown to at least `count` floats (never shrunk; contents unspecified).
  // Throws std::bad_alloc when memory runs out (Model::forward / backward turn it into a Status). The
  // pointer stays valid until the next call with the same name that grows it, or release().
  float* floats(std::string_view name, int64_t count) {
    std::vector<float>* buf = nullptr;
    for (auto& [n, b] : bufs_)
      if (n == name) buf = &b;
    if (buf == nullptr) buf = &bufs_.emplace_back(std::string(name), std::vector<float>()).second;
    if (static_cast<int64_t>(buf->size()) < count) buf->resize(static_cast<size_t>(count));
    return buf->data();
  }

  // Frees every buffer (e.g. after a large backward); later calls grow them again.
  void release() { bufs_.clear(); }

  // Bytes held now.
  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& [n, b] : bufs_) total += static_cast<int64_t>(b.capacity() * sizeof(float));
    return total;
  }

 private:
  std::vector<std::pair<std::string, std::vector<float>>> bufs_;  // few names: a linear search
};

}  // namespace dc
