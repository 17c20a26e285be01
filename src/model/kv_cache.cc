// KvCache sizing, in host memory or on a device.
#include "model/kv_cache.h"

#include <new>
#include <string>

namespace dc {

namespace {
constexpr const char* kRemedy = "; use fewer rows, a shorter canvas, or --cache none";
}

int64_t KvCache::bytes_for(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim) {
  return 2 * n_layer * n_batch * n_seq * kv_dim * static_cast<int64_t>(sizeof(float));
}

void KvCache::clear() {
  k_ = {};
  v_ = {};
  device_.clear();
  backend_ = nullptr;
  n_layer_ = n_batch_ = n_seq_ = kv_dim_ = 0;
}

Status KvCache::reset(const Context& ctx, int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim) {
  filled_ = false;
  if (matches(n_layer, n_batch, n_seq, kv_dim) && backend_ == ctx.backend) return Status::ok_status();
  clear();
  const int64_t layer_bytes = n_batch * n_seq * kv_dim * static_cast<int64_t>(sizeof(float));
  const std::string shape = std::to_string(bytes_for(n_layer, n_batch, n_seq, kv_dim)) + " bytes (" +
                            std::to_string(n_layer) + " layers × " + std::to_string(n_batch) + " rows × " +
                            std::to_string(n_seq) + " positions × " + std::to_string(kv_dim) + " K/V features)";
  if (ctx.device != Device::kCpu) {
    for (int64_t i = 0; i < 2 * n_layer; ++i) {
      auto memory = ctx.backend->allocate(layer_bytes, "the KV cache (" + shape + ")");
      if (!memory.ok()) {
        clear();
        return Status(memory.status().code(), memory.status().message() + kRemedy);
      }
      device_.push_back(std::move(memory).value());
    }
    backend_ = ctx.backend;
  } else {
    const size_t n = static_cast<size_t>(n_layer * n_batch * n_seq * kv_dim);
    try {
      k_.assign(n, 0.0f);
      v_.assign(n, 0.0f);
    } catch (const std::bad_alloc&) {
      clear();
      return resource_exhausted("KV cache: cannot allocate " + shape + kRemedy);
    }
  }
  n_layer_ = n_layer;
  n_batch_ = n_batch;
  n_seq_ = n_seq;
  kv_dim_ = kv_dim;
  return Status::ok_status();
}

}  // namespace dc
