// Atomic writes of files and directories: a checkpoint directory is filled under a temporary name and renamed into
// place, so a kill never leaves a half-written one (used by `convert` and the trainer's checkpoints).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "core/status.h"

namespace dc {

// Creates `<out_dir>.tmp.<pid>` (removing a stale one), calls fill(tmp_dir), then renames it to out_dir
// and fsyncs the parent. An existing out_dir is refused unless `replace`, when it is moved aside first
// and removed after the rename (restored if the rename fails). On any failure the temporary directory
// is removed and out_dir is as before. Parent directories are created.
Status write_dir_atomically(const std::string& out_dir, bool replace,
                            const std::function<Status(const std::string& tmp_dir)>& fill);

// Where write_file_atomically's fill writes its bytes, in order.
using ByteSink = std::function<Status(const void* data, size_t n)>;

// Writes one file atomically: fill(sink) writes the bytes to `path.tmp.<pid>` in the same directory,
// which is fsynced and renamed over `path`, then the directory is fsynced. On any failure (fill's, or a
// write's: disk full) the temporary file is removed and `path` is untouched. Not safe to call
// concurrently on the same path from one process.
Status write_file_atomically(const std::string& path, const std::function<Status(const ByteSink& sink)>& fill);

// Writes `text` to `path` (not atomic by itself: meant for files inside write_dir_atomically's tmp_dir).
Status write_text_file(const std::string& path, const std::string& text);
// Appends `text` to `path` (created if missing), e.g. a line of a run's metrics.jsonl.
Status append_text_file(const std::string& path, const std::string& text);

}  // namespace dc
