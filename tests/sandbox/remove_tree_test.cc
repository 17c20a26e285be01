// remove_tree on the host side: trees deeper than PATH_MAX, directories closed with mode 000,
// symbolic links (never followed), and a loud error when it cannot remove something.
#include "sandbox/remove_tree.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <string>

#include "temp_dir.h"

namespace dc::sandbox {
namespace {

bool exists_path(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

// Builds `levels` nested directories of `name_len`-character names under `top` by descriptor (the
// path is longer than PATH_MAX), a file at the bottom, and makes the bottom directory mode 000.
void make_deep_tree(const std::string& top, int levels, int name_len) {
  int fd = open(top.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < levels; ++i) {
    const std::string n(static_cast<size_t>(name_len), static_cast<char>('a' + i % 26));
    ASSERT_EQ(mkdirat(fd, n.c_str(), 0755), 0) << "level " << i;
    int next = openat(fd, n.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(next, 0);
    close(fd);
    fd = next;
  }
  int f = openat(fd, "bottom", O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(f, 0);
  ASSERT_EQ(write(f, "x", 1), 1);
  close(f);
  fchmod(fd, 0);
  close(fd);
}

TEST(RemoveTree, RemovesATreeDeeperThanPathMax) {
  const test::TempDir tmp("remove_tree");
  const std::string top = tmp.path() + "/dc-sandbox-deep";
  ASSERT_EQ(mkdir(top.c_str(), 0700), 0);
  make_deep_tree(top, 40, 250);  // 40 x 251 = 10040 characters of path
  static_assert(40 * 251 > PATH_MAX);
  // Siblings at several depths, a symbolic link to a file outside that must survive, a 000 file.
  const std::string outside = tmp.path() + "/outside.txt";
  std::ofstream(outside) << "keep me";
  ASSERT_EQ(symlink(outside.c_str(), (top + "/link-to-outside").c_str()), 0);
  ASSERT_EQ(symlink(tmp.path().c_str(), (top + "/link-to-parent-dir").c_str()), 0);
  std::ofstream(top + "/plain") << "x";
  ASSERT_EQ(mkdir((top + "/closed").c_str(), 0), 0);
  Status s = remove_tree(top);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(exists_path(top));
  EXPECT_TRUE(exists_path(outside));  // the link was removed, not followed
  EXPECT_TRUE(exists_path(tmp.path()));
}

TEST(RemoveTree, AMissingDirIsFineAndAFileIsRemoved) {
  const test::TempDir tmp("remove_tree");
  EXPECT_TRUE(remove_tree(tmp.path() + "/not-there").ok());
  const std::string f = tmp.path() + "/file";
  std::ofstream(f) << "x";
  EXPECT_TRUE(remove_tree(f).ok());
  EXPECT_FALSE(exists_path(f));
}

TEST(RemoveTree, FailsLoudlyWhenItCannot) {
  // A mount point inside the tree cannot be removed (EBUSY). Made in a child process with a mount
  // namespace of its own (so this process's mounts are untouched), which reports through its exit code.
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a mount point";
  const test::TempDir tmp("remove_tree");
  const std::string top = tmp.path() + "/t";
  ASSERT_EQ(mkdir(top.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((top + "/m").c_str(), 0700), 0);
  std::ofstream(top + "/f") << "x";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", (top + "/m").c_str(), "tmpfs", 0, "size=1m") != 0)
      _exit(77);
    Status s = remove_tree(top);
    const bool loud = !s.ok() && s.message().find("cannot remove " + top) != std::string::npos &&
                      s.message().find("Device or resource busy") != std::string::npos &&
                      s.message().find("rm -rf") != std::string::npos;
    _exit(loud ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) GTEST_SKIP() << "cannot make a private mount namespace here";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "remove_tree did not report the busy mount point";
  EXPECT_TRUE(remove_tree(top).ok());  // the mount went with the child's namespace
  EXPECT_FALSE(exists_path(top));
}

}  // namespace
}  // namespace dc::sandbox
