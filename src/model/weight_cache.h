// The packed-weight cache: the kPanels copies that Model::pack_weights makes at load (ops/weight.h),
// kept in one file so that the next start of the same checkpoint maps them instead of re-laying every
// matrix. The file is tied to its checkpoint's files (name, size, mtime), the matmul precision and the
// packing format; every buffer carries a checksum that is verified before use.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/mapped_file.h"

namespace dc {

class ThreadPool;

// What a cache file must match to be used.
struct WeightCacheKey {
  struct Source {
    std::string name;  // file name inside the checkpoint directory
    int64_t size = 0;
    int64_t mtime_ns = 0;
  };
  std::string precision;             // "f32" | "bf16": the matmul precision the buffers were packed for
  std::vector<Source> sources;       // config.json and every safetensors file
  struct Buffer {
    std::string name;                // e.g. "model.layers.0.mlp.up_proj.weight" or "...weight.scales"
    int64_t bytes = 0;
  };
  std::vector<Buffer> buffers;       // in the order Model::pack_weights packs them
};

// The key's sources for the checkpoint in `dir`: config.json and `weight_files` (paths), stat'ed now.
// Errors name the file that cannot be stat'ed.
Result<std::vector<WeightCacheKey::Source>> weight_cache_sources(const std::string& dir,
                                                                 const std::vector<std::string>& weight_files);

// Where the cache of the checkpoint in `dir` lives by default: `dir/diffucoder-packed.<precision>.bin`
// when `dir` is writable, else weight_cache_path_in(`$XDG_CACHE_HOME/diffucoder` or
// `~/.cache/diffucoder`). "" when neither can be used.
std::string default_weight_cache_path(const std::string& dir, const std::string& precision);

// The cache of the checkpoint in `dir` inside `cache_dir`, named after the checkpoint's absolute path.
std::string weight_cache_path_in(const std::string& cache_dir, const std::string& dir, const std::string& precision);

// True for the names default_weight_cache_path() gives inside a checkpoint (and their temporaries), so
// that tools copying a checkpoint's small files can leave them out.
bool is_weight_cache_file_name(const std::string& file_name);  // "diffucoder-packed.*"

// A cache file that matched its key and passed every checksum: `buffers[i]` points at key.buffers[i]
// (4096-byte aligned) inside the read-only mapping, valid while `file` lives.
struct WeightCacheHit {
  MappedFile file;
  std::vector<const uint8_t*> buffers;
};

// Opens and verifies the cache at `path` against `key` (checksums computed on `pool`, which also brings
// the pages into memory). kNotFound when there is no file; kInvalidArgument naming what differs when it belongs to other files, another precision or another packing format
// (stale); kParseError when it is damaged (bad header, truncated, a checksum that does not match).
Result<WeightCacheHit> open_weight_cache(const std::string& path, const WeightCacheKey& key, ThreadPool* pool);

// Writes `buffers` (key.buffers[i].bytes each) as the cache at `path`, atomically: into
// `path.tmp.<pid>.<n>`, renamed over `path` when complete; the temporary is removed on failure. Creates
// the parent directory when missing. `bytes_written` (may be null) counts progress. Errors name the path.
Status write_weight_cache(const std::string& path, const WeightCacheKey& key, const std::vector<const void*>& buffers,
                          std::atomic<int64_t>* bytes_written = nullptr);

}  // namespace dc
