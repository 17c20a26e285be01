// core/pages.h: large buffers in mappings of their own, advised MADV_DONTFORK while a PagesLeftBehind lives
// (those allocated meanwhile too, nested holders counted), small ones from malloc; the alignments promised;
// the std::vector allocator; and a real fork's view of both, with and without the advice.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/pages.h"
#include "mapping_flags.h"

namespace dc {
namespace {

using test::has_flag;
using test::mapping_flags;

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(Pages, LargeBuffersHaveTheirOwnMappingAdvisedDontforkWhileLeftBehind) {
  for (size_t bytes : {kOwnMappingBytes, kOwnMappingBytes + 1, size_t{2} << 20, (size_t{5} << 20) + 123}) {
    PageArray<uint8_t> buf = alloc_page_array<uint8_t>(bytes);
    ASSERT_TRUE(buf) << bytes;
    std::memset(buf.get(), 0x5a, bytes);  // all of it is writable
    EXPECT_EQ(buf[bytes - 1], 0x5a);
    EXPECT_FALSE(has_flag(mapping_flags(buf.get()), "dc")) << bytes;
    std::string flags, last;
    {
      const PagesLeftBehind outer;
      {
        const PagesLeftBehind inner;
      }
      flags = mapping_flags(buf.get()), last = mapping_flags(buf.get() + bytes - 1);  // (the outer one holds)
    }
    EXPECT_TRUE(has_flag(flags, "dc")) << bytes << ": " << flags;
    EXPECT_TRUE(has_flag(last, "dc")) << bytes << ": " << last;
    EXPECT_FALSE(has_flag(mapping_flags(buf.get()), "dc")) << bytes << ": the advice outlived its holders";
    if (bytes >= (size_t{2} << 20)) {
      EXPECT_EQ(address(buf.get()) % (size_t{2} << 20), 0u) << bytes;
      EXPECT_TRUE(has_flag(flags, "hg")) << bytes << ": " << flags;
    } else {
      EXPECT_EQ(address(buf.get()) % 4096, 0u) << bytes;
    }
  }
}

TEST(Pages, SmallBuffersComeFromMallocWithoutTheAdvice) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000}, kOwnMappingBytes - 1}) {
    PageArray<uint8_t> buf = alloc_page_array<uint8_t>(bytes);
    ASSERT_TRUE(buf) << bytes;
    EXPECT_EQ(address(buf.get()) % 64, 0u) << bytes;
    if (bytes > 0) std::memset(buf.get(), 1, bytes);
    const PagesLeftBehind left_behind;
    EXPECT_FALSE(has_flag(mapping_flags(buf.get()), "dc")) << bytes;
  }
}

TEST(Pages, VectorsGrowIntoAdvisedMappingsAndKeepTheirValues) {
  std::vector<float, PageAllocator<float>> v;
  for (int i = 0; i < 100; ++i) v.push_back(static_cast<float>(i));
  EXPECT_FALSE(has_flag(mapping_flags(v.data()), "dc"));
  const PagesLeftBehind left_behind;  // (v and w grow into new mappings, advised as they are made)
  v.resize(size_t{4} << 20);  // 16 MiB
  for (int i = 0; i < 100; ++i) ASSERT_EQ(v[i], static_cast<float>(i)) << i;
  EXPECT_EQ(v.back(), 0.0f);
  EXPECT_TRUE(has_flag(mapping_flags(v.data()), "dc"));
  std::vector<float, PageAllocator<float>> w = v;  // a copy gets its own mapping
  EXPECT_NE(w.data(), v.data());
  EXPECT_EQ(w[99], 99.0f);
  EXPECT_TRUE(has_flag(mapping_flags(w.data()), "dc"));
}

// What the advice is for: a child forked while a PagesLeftBehind lives has the small buffer and not the large
// one (madvise on an address no mapping holds fails with ENOMEM); one forked outside it (Python's
// multiprocessing "fork") has both. The child makes system calls only.
bool child_has_large_and_small(const void* large, const void* small, bool want_large) {
  const uintptr_t page = address(small) / 4096 * 4096;
  const pid_t pid = fork();
  if (pid == 0) {
    const bool large_there = madvise(const_cast<void*>(large), 4096, MADV_NORMAL) == 0;
    const bool small_there = madvise(reinterpret_cast<void*>(page), 4096, MADV_NORMAL) == 0;
    _exit(large_there == want_large && small_there ? 0 : 1);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(Pages, AChildForkedWhileLeftBehindHasNoneOfTheLargeBuffers) {
  PageArray<uint8_t> large = alloc_page_array<uint8_t>(size_t{8} << 20);
  PageArray<uint8_t> small = alloc_page_array<uint8_t>(4096);
  ASSERT_TRUE(large && small);
  std::memset(large.get(), 1, size_t{8} << 20);
  std::memset(small.get(), 1, 4096);
  {
    const PagesLeftBehind left_behind;
    EXPECT_TRUE(child_has_large_and_small(large.get(), small.get(), false)) << "the advice did not hold";
  }
  EXPECT_TRUE(child_has_large_and_small(large.get(), small.get(), true)) << "a plain fork lost the buffer";
}

}  // namespace
}  // namespace dc
