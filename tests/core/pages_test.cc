// core/pages.h: large buffers in mappings of their own that a fork does not carry (MADV_DONTFORK), small ones
// from malloc; the alignments promised; the std::vector allocator; and a real fork's view of both.
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

TEST(Pages, LargeBuffersHaveTheirOwnMappingAdvisedDontfork) {
  for (size_t bytes : {kOwnMappingBytes, kOwnMappingBytes + 1, size_t{2} << 20, (size_t{5} << 20) + 123}) {
    PageArray<uint8_t> buf = alloc_page_array<uint8_t>(bytes);
    ASSERT_TRUE(buf) << bytes;
    std::memset(buf.get(), 0x5a, bytes);  // all of it is writable
    EXPECT_EQ(buf[bytes - 1], 0x5a);
    const std::string flags = mapping_flags(buf.get()), last = mapping_flags(buf.get() + bytes - 1);
    EXPECT_TRUE(has_flag(flags, "dc")) << bytes << ": " << flags;
    EXPECT_TRUE(has_flag(last, "dc")) << bytes << ": " << last;
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
    EXPECT_FALSE(has_flag(mapping_flags(buf.get()), "dc")) << bytes;
  }
}

TEST(Pages, VectorsGrowIntoAdvisedMappingsAndKeepTheirValues) {
  std::vector<float, PageAllocator<float>> v;
  for (int i = 0; i < 100; ++i) v.push_back(static_cast<float>(i));
  EXPECT_FALSE(has_flag(mapping_flags(v.data()), "dc"));
  v.resize(size_t{4} << 20);  // 16 MiB
  for (int i = 0; i < 100; ++i) ASSERT_EQ(v[i], static_cast<float>(i)) << i;
  EXPECT_EQ(v.back(), 0.0f);
  EXPECT_TRUE(has_flag(mapping_flags(v.data()), "dc"));
  std::vector<float, PageAllocator<float>> w = v;  // a copy gets its own mapping
  EXPECT_NE(w.data(), v.data());
  EXPECT_EQ(w[99], 99.0f);
  EXPECT_TRUE(has_flag(mapping_flags(w.data()), "dc"));
}

// What the advice is for: a forked child has the small buffer and not the large one (madvise on an address
// no mapping holds fails with ENOMEM). The child makes system calls only.
TEST(Pages, AForkedChildHasNoneOfTheLargeBuffers) {
  PageArray<uint8_t> large = alloc_page_array<uint8_t>(size_t{8} << 20);
  PageArray<uint8_t> small = alloc_page_array<uint8_t>(4096);
  ASSERT_TRUE(large && small);
  std::memset(large.get(), 1, size_t{8} << 20);
  std::memset(small.get(), 1, 4096);
  const uintptr_t page = address(small.get()) / 4096 * 4096;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const bool large_gone = madvise(large.get(), 4096, MADV_NORMAL) != 0 && errno == ENOMEM;
    const bool small_there = madvise(reinterpret_cast<void*>(page), 4096, MADV_NORMAL) == 0;
    _exit(large_gone && small_there ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
}

}  // namespace
}  // namespace dc
