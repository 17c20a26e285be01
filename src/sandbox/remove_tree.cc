// remove_tree (remove_tree.h): a depth-first walk by descriptor. At each directory every entry that is
// not a non-empty directory is unlinked at once; the first non-empty one is entered (its name pushed),
// and once a directory is empty the walk climbs to ".." and removes it by name.
#include "sandbox/remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace dc::sandbox {
namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

std::string where(const std::string& dir, const std::vector<std::string>& names, const char* last) {
  std::string p = dir;
  size_t depth = names.size();
  p += " (at depth " + std::to_string(depth) + (last ? std::string(", entry '") + last + "'" : "") + ")";
  return p;
}

// Opens directory `name` of `parent`, making it readable and searchable first if a program closed it.
int open_child_dir(int parent, const char* name) {
  int fd = openat(parent, name, kDirFlags);
  if (fd < 0 && errno == EACCES && fchmodat(parent, name, 0700, 0) == 0) fd = openat(parent, name, kDirFlags);
  return fd;
}

// Unlinks every entry of `fd` it can; returns 1 with `child` set to the first non-empty directory,
// 0 when the directory is empty now, -1 on error (errno, `child` = the entry).
int empty_dir(int fd, std::string& child) {
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return -1;
  DIR* d = fdopendir(dup_fd);
  if (!d) {
    close(dup_fd);
    return -1;
  }
  rewinddir(d);
  int result = 0;
  while (dirent* e = readdir(d)) {
    const char* n = e->d_name;
    if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0) continue;
    if (e->d_type != DT_DIR && (unlinkat(fd, n, 0) == 0 || errno == ENOENT)) continue;
    if (e->d_type != DT_DIR && errno != EISDIR) {
      child = n;
      result = -1;
      break;
    }
    if (unlinkat(fd, n, AT_REMOVEDIR) == 0 || errno == ENOENT) continue;
    child = n;
    result = (errno == ENOTEMPTY || errno == EEXIST || errno == EACCES || errno == EPERM) ? 1 : -1;
    break;
  }
  const int saved = errno;
  closedir(d);
  errno = saved;
  return result;
}

}  // namespace

Status remove_tree(const std::string& dir) {
  int fd = open(dir.c_str(), kDirFlags);
  if (fd < 0 && errno == ENOENT) return Status::ok_status();
  if (fd < 0 && (errno == ENOTDIR || errno == ELOOP)) {  // a file or a link: remove it, never follow it
    if (unlink(dir.c_str()) == 0) return Status::ok_status();
  }
  if (fd < 0 && errno == EACCES && chmod(dir.c_str(), 0700) == 0) fd = open(dir.c_str(), kDirFlags);
  if (fd < 0) return io_error("cannot remove " + dir + ": " + std::strerror(errno));
  fchmod(fd, 0700);  // unlinking needs write and search permission on the directory
  std::vector<std::string> names;  // the path from `dir` down to fd
  auto fail = [&](const char* entry) {
    const int e = errno;
    close(fd);
    return io_error("cannot remove " + where(dir, names, entry) + ": " + std::strerror(e) +
                    "; remove it by hand (rm -rf, as its owner or root)");
  };
  for (;;) {
    std::string child;
    const int r = empty_dir(fd, child);
    if (r < 0) return fail(child.empty() ? nullptr : child.c_str());
    if (r == 1) {  // enter the non-empty directory
      int cfd = open_child_dir(fd, child.c_str());
      if (cfd < 0) return fail(child.c_str());
      fchmod(cfd, 0700);
      close(fd);
      fd = cfd;
      names.push_back(std::move(child));
      continue;
    }
    if (names.empty()) break;  // `dir` itself is empty
    int pfd = openat(fd, "..", kDirFlags);
    if (pfd < 0) return fail("..");
    close(fd);
    fd = pfd;
    const std::string name = std::move(names.back());
    names.pop_back();
    if (unlinkat(fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return fail(name.c_str());
  }
  close(fd);
  if (rmdir(dir.c_str()) != 0 && errno != ENOENT) return io_error("cannot remove " + dir + ": " + std::strerror(errno));
  return Status::ok_status();
}

}  // namespace dc::sandbox
