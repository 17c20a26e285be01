// The kPanels copy of a weight, made the way Model::pack_weights makes it: for the kernel tests
// (kernel_test_util.h) and the kernel benchmarks (bench/kernels/), so without GoogleTest.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/context.h"
#include "ops/matmul.h"

namespace dc::testing {

// The kPanels copy of a weight (bf16 or quantized), packed in two chunks of panels as Model::pack_weights
// packs in chunks; the buffers start poisoned (0xa5 bytes), so unwritten bytes show.
struct PackedCopy {
  using Buffer = std::unique_ptr<uint8_t[], decltype(&std::free)>;
  Buffer data{nullptr, &std::free}, scales{nullptr, &std::free}, mins{nullptr, &std::free};
  WeightView view;

  PackedCopy(ThreadPool* pool, const WeightView& w) {
    const PanelSizes sizes = panel_sizes(w);
    auto buffer = [](int64_t bytes) {
      Buffer b(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)), &std::free);
      std::fill_n(b.get(), bytes, uint8_t{0xa5});
      return b;
    };
    data = buffer(sizes.data_bytes), scales = buffer(sizes.table_bytes), mins = buffer(sizes.table_bytes);
    Context ctx{Device::kCpu, pool};
    pack_panels(ctx, w, data.get(), scales.get(), mins.get(), 0, sizes.panels / 2);
    view = pack_panels(ctx, w, data.get(), scales.get(), mins.get(), sizes.panels / 2, sizes.panels);
  }
  const uint32_t* words() const { return reinterpret_cast<const uint32_t*>(data.get()); }
};

}  // namespace dc::testing
