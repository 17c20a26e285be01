// write_dir_atomically: temporary directory + rename, with the parent fsynced.
#include "io/atomic_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace dc {
namespace fs = std::filesystem;
namespace {

// Makes a rename inside `dir` durable; file systems that cannot fsync a directory are ignored.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

Status write_all(int fd, const void* data, size_t n, const std::string& tmp_path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot write '" + tmp_path + "': " + std::strerror(errno) + " (disk full?)");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok_status();
}

}  // namespace

Status write_file_atomically(const std::string& path, const std::function<Status(const ByteSink& sink)>& fill) {
  const std::string tmp_path = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return io_error("cannot create '" + tmp_path + "': " + std::strerror(errno) +
                    " (does the directory exist and is it writable?)");
  }
  Status status = fill([&](const void* data, size_t n) { return write_all(fd, data, n, tmp_path); });
  if (status.ok() && ::fsync(fd) != 0) status = io_error("cannot fsync '" + tmp_path + "': " + std::strerror(errno));
  if (::close(fd) != 0 && status.ok()) status = io_error("cannot close '" + tmp_path + "': " + std::strerror(errno));
  if (status.ok() && ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status = io_error("cannot rename '" + tmp_path + "' to '" + path + "': " + std::strerror(errno));
  }
  if (!status.ok()) {
    ::unlink(tmp_path.c_str());
    return status;
  }
  std::string dir = fs::path(path).parent_path().string();
  fsync_dir(dir.empty() ? "." : dir);
  return Status::ok_status();
}

namespace {

Status write_or_append(const std::string& path, const std::string& text, const char* mode) {
  FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) return io_error("cannot open " + path + " for writing: " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return io_error("cannot write " + path + " (disk full?)");
  return Status();
}

}  // namespace

Status write_text_file(const std::string& path, const std::string& text) { return write_or_append(path, text, "wb"); }

Status append_text_file(const std::string& path, const std::string& text) { return write_or_append(path, text, "ab"); }

Status write_dir_atomically(const std::string& out_dir, bool replace,
                            const std::function<Status(const std::string& tmp_dir)>& fill) {
  std::error_code ec;
  const fs::path out = fs::path(out_dir).lexically_normal();
  if (fs::exists(out, ec) && !replace)
    return invalid_argument("output directory '" + out_dir + "' already exists; pass --force to replace it");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  const std::string tmp = out.string() + ".tmp." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec))
    return io_error("cannot create '" + tmp + "': " + (ec ? ec.message() : std::string("it exists")));
  Status status = fill(tmp);
  if (status.ok()) fsync_dir(tmp);
  if (status.ok() && fs::exists(out, ec)) {  // replace: move the old directory away, then rename
    const std::string old = out.string() + ".old." + std::to_string(::getpid());
    fs::rename(out, old, ec);
    if (ec) {
      status = io_error("cannot move the existing '" + out.string() + "' aside: " + ec.message());
    } else {
      fs::rename(tmp, out, ec);
      if (ec) {
        status = io_error("cannot rename '" + tmp + "' to '" + out.string() + "': " + ec.message());
        fs::rename(old, out, ec);
      } else {
        fs::remove_all(old, ec);
      }
    }
  } else if (status.ok()) {
    fs::rename(tmp, out, ec);
    if (ec) status = io_error("cannot rename '" + tmp + "' to '" + out.string() + "': " + ec.message());
  }
  if (!status.ok()) {
    fs::remove_all(tmp, ec);
    return status;
  }
  fsync_dir(parent.string());
  return Status();
}

}  // namespace dc
