// The single-process Comm and shard_range (the MPI backend: mpi_comm_check.cc under mpirun).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "dist/comm.h"

namespace dc::dist {
namespace {

TEST(ShardRange, ContiguousDisjointAndBalanced) {
  for (int64_t n : {0, 1, 7, 64, 1000003}) {
    for (int size : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int r = 0; r < size; ++r) {
        const Range s = shard_range(n, r, size);
        EXPECT_EQ(s.begin, next) << n << " " << size << " " << r;
        EXPECT_GE(s.size(), n / size);
        EXPECT_LE(s.size(), n / size + 1);
        next = s.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(SingleComm, IsOneRankAndAdds) {
  auto c = single_comm();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->local_rank(), 0);
  const std::vector<float> in = {1.5f, -2.0f};
  std::vector<float> out = {1.0f, 1.0f, 1.0f, 1.0f};
  ASSERT_TRUE(c->reduce_scatter_add(in.data(), {1, 3}, 4, out.data()).ok());  // values 1 and 2 of 4
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.5f, -1.0f, 1.0f}));
  auto started = c->reduce_scatter_add_start(in.data(), {2, 4}, 4, out.data());  // the non-blocking one
  ASSERT_TRUE(started.ok());
  ASSERT_TRUE(c->finish(*started).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 2.5f, 0.5f, -1.0f}));
  std::string s = "kept";
  ASSERT_TRUE(c->broadcast_string(s, 0).ok());
  EXPECT_EQ(s, "kept");
  auto sum = c->sum_doubles({2.0, 3.0});
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(c->bytes_sent(), 0);
}

TEST(WorldComm, WithoutALauncherIsOneProcess) {
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("PMI_SIZE");
  unsetenv("PMIX_SIZE");
  EXPECT_FALSE(launched_as_ranks());
  auto c = world_comm(10);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ((*c)->size(), 1);
  EXPECT_STREQ((*c)->backend(), "single");
}

}  // namespace
}  // namespace dc::dist
