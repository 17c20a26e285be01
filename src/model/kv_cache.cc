// KvCache sizing.
#include "model/kv_cache.h"

#include <new>
#include <string>

namespace dc {

int64_t KvCache::bytes_for(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim) {
  return 2 * n_layer * n_batch * n_seq * kv_dim * static_cast<int64_t>(sizeof(float));
}

Status KvCache::reset(int64_t n_layer, int64_t n_batch, int64_t n_seq, int64_t kv_dim) {
  filled_ = false;
  if (matches(n_layer, n_batch, n_seq, kv_dim)) return Status::ok_status();
  const size_t n = static_cast<size_t>(n_layer * n_batch * n_seq * kv_dim);
  try {
    k_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
  } catch (const std::bad_alloc&) {
    k_ = {};
    v_ = {};
    n_layer_ = n_batch_ = n_seq_ = kv_dim_ = 0;
    return resource_exhausted("KV cache: cannot allocate " + std::to_string(bytes_for(n_layer, n_batch, n_seq, kv_dim)) +
                        " bytes (" + std::to_string(n_layer) + " layers × " + std::to_string(n_batch) + " rows × " +
                        std::to_string(n_seq) + " positions × " + std::to_string(kv_dim) +
                        " K/V features); use cache none or a smaller batch");
  }
  n_layer_ = n_layer;
  n_batch_ = n_batch;
  n_seq_ = n_seq;
  kv_dim_ = kv_dim;
  return Status::ok_status();
}

}  // namespace dc
