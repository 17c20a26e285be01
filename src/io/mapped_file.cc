// POSIX mmap of a whole file, and reading a small text file into a string.
#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace dc {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

Status open_error(const std::string& what, const std::string& path, int err) {
  std::string msg = "cannot " + what + " '" + path + "': " + errno_text(err);
  if (err == ENOENT) return not_found(msg + " (check the path)");
  if (err == EACCES) return io_error(msg + " (check the file permissions)");
  return io_error(msg);
}

// Opens `path` read-only and checks that it is a regular file; returns the fd and its size. O_NONBLOCK
// keeps a FIFO from blocking the open (regular files ignore it).
Status open_regular_file(const std::string& path, int* fd_out, size_t* size_out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return open_error("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return open_error("stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket";
    return invalid_argument("'" + path + "' is not a regular file (" + kind + "); pass a file path");
  }
  *fd_out = fd;
  *size_out = static_cast<size_t>(st.st_size);
  return Status::ok_status();
}

}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = -1;
  size_t size = 0;
  DC_RETURN_IF_ERROR(open_regular_file(path, &fd, &size));
  MappedFile file;
  file.path_ = path;
  if (size == 0) {
    ::close(fd);
    return file;
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return open_error("mmap", path, err);
  file.data_ = static_cast<const uint8_t*>(p);
  file.size_ = size;
  return file;
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

Result<std::string> read_text_file(const std::string& path, int64_t max_bytes) {
  int fd = -1;
  size_t size = 0;
  DC_RETURN_IF_ERROR(open_regular_file(path, &fd, &size));
  auto too_large = [&] {
    ::close(fd);
    return out_of_range("'" + path + "' is larger than the limit of " + std::to_string(max_bytes) +
                        " bytes for this file");
  };
  if (static_cast<uint64_t>(size) > static_cast<uint64_t>(max_bytes)) return too_large();
  std::string text;
  text.resize(size);
  size_t done = 0;
  while (true) {
    if (done == text.size()) {  // the file may have grown
      if (static_cast<int64_t>(done) >= max_bytes) return too_large();
      text.resize(text.size() + 4096);
    }
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return open_error("read", path, err);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

void release_pages(const void* p, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice only
}

}  // namespace dc
