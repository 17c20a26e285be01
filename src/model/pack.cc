// Model::pack_weights: every matrix the fast kernels read faster re-laid once at load (kPanels), or
// mapped from the packed-weight cache (model/weight_cache.h) written in the background the first time.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>

#include "core/log.h"
#include "io/mapped_file.h"
#include "model/transformer.h"
#include "model/weight_cache.h"
#include "ops/matmul.h"

namespace dc {

// The matrices of the layers and an untied lm_head that ctx's kernels read faster packed, named.
std::vector<Model::PackTarget> Model::pack_targets(const Context& ctx) {
  std::vector<PackTarget> targets;
  auto add = [&](std::string name, WeightView* w) {
    if (worth_packing(ctx, *w)) targets.push_back({std::move(name), w, panel_sizes(*w)});
  };
  for (size_t il = 0; il < weights_.layers.size(); ++il) {
    LayerWeights& l = weights_.layers[il];
    const std::string p = "layers." + std::to_string(il) + ".";
    add(p + "wq", &l.wq), add(p + "wk", &l.wk), add(p + "wv", &l.wv), add(p + "wo", &l.wo);
    add(p + "w_gate", &l.w_gate), add(p + "w_up", &l.w_up), add(p + "w_down", &l.w_down);
  }
  if (weights_.output.data != weights_.tok_embd.data) add("output", &weights_.output);  // tied: embedding rows
  return targets;
}

Status Model::pack_weights(const Context& ctx) {
  std::vector<PackTarget> targets = pack_targets(ctx);
  // The row-major pages are released only where nobody else can read them: a mapped checkpoint (they
  // come back from the file) or in-memory storage this model alone owns.
  const bool release = checkpoint_ != nullptr || (storage_ != nullptr && storage_.use_count() == 1);
  constexpr int64_t kChunkPanels = 64;  // panels packed between page releases
  for (PackTarget& t : targets) {
    WeightView* w = t.w;
    const PanelSizes& sizes = t.sizes;
    std::vector<PageArray<uint8_t>> bufs;
    for (int64_t bytes : {sizes.data_bytes, sizes.table_bytes, sizes.table_bytes}) {
      if (bytes == 0) break;
      bufs.push_back(alloc_page_array<uint8_t>(static_cast<size_t>(bytes)));
      if (!bufs.back()) return resource_exhausted("pack_weights: out of memory allocating " + std::to_string(bytes) + " bytes");
    }
    const int64_t row_bytes = w->quant == WeightQuant::kQ4 ? w->cols / 2 : w->cols * (w->quantized() ? 1 : 2);
    WeightView packed;
    for (int64_t p0 = 0; p0 < sizes.panels; p0 += kChunkPanels) {
      const int64_t p1 = std::min(sizes.panels, p0 + kChunkPanels);
      packed = pack_panels(ctx, *w, bufs[0].get(), bufs.size() > 1 ? bufs[1].get() : nullptr,
                           bufs.size() > 2 ? bufs[2].get() : nullptr, p0, p1);
      const int64_t r0 = p0 * sizes.panel_rows, r1 = std::min(w->rows, p1 * sizes.panel_rows);
      if (release)
        release_pages(static_cast<const char*>(w->data) + r0 * row_bytes, static_cast<size_t>((r1 - r0) * row_bytes));
    }
    if (release && sizes.table_bytes > 0) {  // the kQ4 tables, re-laid whole
      release_pages(w->scales, static_cast<size_t>(sizes.table_bytes));
      release_pages(w->mins, static_cast<size_t>(sizes.table_bytes));
    }
    *w = packed;
    for (auto& b : bufs) packed_.push_back(std::move(b));
  }
  return Status();
}

Status Model::pack_weights(const Context& ctx, const std::string& cache_path, WeightCacheReport* report) {
  WeightCacheReport local;
  WeightCacheReport& r = report != nullptr ? *report : local;
  r = WeightCacheReport{};
  r.path = cache_path;
  std::vector<PackTarget> targets = pack_targets(ctx);
  if (cache_path.empty() || checkpoint_ == nullptr || targets.empty())
    return pack_weights(ctx);  // nothing to cache (or no files to tie a cache to): plain packing

  WeightCacheKey key;
  key.precision = ctx.matmul_precision == MatmulPrecision::kBF16 ? "bf16" : "f32";
  std::vector<std::string> files;
  for (const SafetensorsFile& f : checkpoint_->files()) files.push_back(f.path());
  DC_ASSIGN_OR_RETURN(key.sources, weight_cache_sources(checkpoint_->dir(), files));
  for (const PackTarget& t : targets) {
    key.buffers.push_back({t.name, t.sizes.data_bytes});
    if (t.sizes.table_bytes > 0) {
      key.buffers.push_back({t.name + ".scales", t.sizes.table_bytes});
      key.buffers.push_back({t.name + ".mins", t.sizes.table_bytes});
    }
  }
  for (const auto& b : key.buffers) r.bytes += b.bytes;

  Result<WeightCacheHit> hit = open_weight_cache(cache_path, key, ctx.pool);
  if (hit.ok()) {
    size_t i = 0;
    for (PackTarget& t : targets) {
      const uint8_t* data = hit->buffers[i++];
      const uint8_t* scales = nullptr;
      const uint8_t* mins = nullptr;
      if (t.sizes.table_bytes > 0) scales = hit->buffers[i++], mins = hit->buffers[i++];
      *t.w = panel_view(*t.w, data, scales, mins);
    }
    packed_file_ = std::make_unique<MappedFile>(std::move(hit->file));
    r.outcome = WeightCacheReport::kLoaded;
    return Status();
  }
  if (hit.status().code() != StatusCode::kNotFound) r.note = hit.status().message();  // stale or damaged: rebuilt

  DC_RETURN_IF_ERROR(pack_weights(ctx));
  std::vector<const void*> buffers;
  for (const auto& b : packed_) buffers.push_back(b.get());
  r.outcome = WeightCacheReport::kWriting;
  cache_total_ = r.bytes;
  cache_writer_ = std::thread([this, cache_path, key = std::move(key), buffers = std::move(buffers)] {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);  // behind the forwards
    cache_write_status_ = write_weight_cache(cache_path, key, buffers, &cache_written_);
    cache_done_ = true;
  });
  return Status();
}

Status Model::wait_for_weight_cache() {
  if (!cache_writer_.joinable()) return cache_write_status_;
  if (!cache_done_ && cache_total_ - cache_written_ > (int64_t{64} << 20)) {
    char line[160];
    std::snprintf(line, sizeof(line), "finishing the packed-weight cache (%.1f of %.1f GB written; the next start maps it)...",
                  static_cast<double>(cache_written_) / 1e9, static_cast<double>(cache_total_) / 1e9);
    dc::log(LogLevel::kInfo, line);
  }
  cache_writer_.join();
  return cache_write_status_;
}

Model::~Model() {
  if (cache_writer_.joinable()) {
    if (Status s = wait_for_weight_cache(); !s.ok())
      dc::log(LogLevel::kWarning, "the packed-weight cache was not written: " + s.message());
  }
}

}  // namespace dc
