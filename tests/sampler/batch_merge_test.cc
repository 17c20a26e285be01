// merge_left_padded: rows stacked and left-padded to the widest part, positions / validity emitted only
// when needed, out_rows moved to the merged rows, each part's logit rows found by out_begin.
#include <gtest/gtest.h>

#include <vector>

#include "sampler/batch_merge.h"

namespace dc {
namespace {

TEST(MergeLeftPadded, StacksPadsAndMovesTheLogitRows) {
  // Part 0: 2 rows of 3 positions, logits of (row 0, pos 2) and (row 1, pos 0). Part 1: 1 row of 5
  // positions with its own padding (its first position) and explicit positions, logits of pos 4.
  const std::vector<int32_t> t0 = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> o0 = {2, 3};
  const std::vector<int32_t> t1 = {9, 7, 8, 9, 10};
  const std::vector<uint8_t> v1 = {0, 1, 1, 1, 1};
  const std::vector<int32_t> p1 = {1, 0, 1, 2, 3};
  const std::vector<int64_t> o1 = {4};
  ForwardBatch a, b;
  a.n_batch = 2, a.n_seq = 3, a.tokens = t0.data(), a.out_rows = o0.data(), a.n_out = 2;
  b.n_batch = 1, b.n_seq = 5, b.tokens = t1.data(), b.valid = v1.data(), b.positions = p1.data();
  b.out_rows = o1.data(), b.n_out = 1;
  const std::vector<ForwardBatch> parts = {a, b};
  auto m = merge_left_padded(parts);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->n_batch, 3);
  EXPECT_EQ(m->n_seq, 5);
  EXPECT_EQ(m->tokens, (std::vector<int32_t>{0, 0, 1, 2, 3, 0, 0, 4, 5, 6, 9, 7, 8, 9, 10}));
  EXPECT_EQ(m->valid, (std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(m->positions, (std::vector<int32_t>{1, 1, 0, 1, 2, 1, 1, 0, 1, 2, 1, 0, 1, 2, 3}));
  EXPECT_EQ(m->out_rows, (std::vector<int64_t>{4, 7, 14}));
  EXPECT_EQ(m->out_begin, (std::vector<int64_t>{0, 2, 3}));
  const ForwardBatch fb = m->batch();
  EXPECT_EQ(fb.n_batch, 3);
  EXPECT_EQ(fb.n_out, 3);
  EXPECT_EQ(fb.valid, m->valid.data());
  EXPECT_EQ(fb.cache_op, CacheOp::kNone);
}

TEST(MergeLeftPadded, EqualWidthsWithoutPaddingStayUnpadded) {
  const std::vector<int32_t> t0 = {1, 2, 3}, t1 = {4, 5, 6};
  const std::vector<int64_t> o0 = {0}, o1 = {1, 2};
  ForwardBatch a, b;
  a.n_batch = 1, a.n_seq = 3, a.tokens = t0.data(), a.out_rows = o0.data(), a.n_out = 1;
  b.n_batch = 1, b.n_seq = 3, b.tokens = t1.data(), b.out_rows = o1.data(), b.n_out = 2;
  const std::vector<ForwardBatch> parts = {a, b};
  auto m = merge_left_padded(parts);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->valid.empty());
  EXPECT_TRUE(m->positions.empty());
  EXPECT_EQ(m->batch().valid, nullptr);
  EXPECT_EQ(m->batch().positions, nullptr);
  EXPECT_EQ(m->out_rows, (std::vector<int64_t>{0, 4, 5}));
}

TEST(MergeLeftPadded, RefusesCacheForwardsAndNothing) {
  EXPECT_FALSE(merge_left_padded({}).ok());
  const std::vector<int32_t> t = {1, 2};
  ForwardBatch a;
  a.n_batch = 1, a.n_seq = 2, a.tokens = t.data(), a.cache_op = CacheOp::kRefresh;
  const std::vector<ForwardBatch> parts = {a};
  EXPECT_FALSE(merge_left_padded(parts).ok());
}

}  // namespace
}  // namespace dc
