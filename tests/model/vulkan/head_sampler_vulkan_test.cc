// The device's HeadSampler (engine/device_head_sampler.h) against the CPU's (engine/head_sampler.h, the
// reference kernels) on one forward of a synthetic model on device 0 (lavapipe in CI): greedy and sampled
// steps with and without top-k / top-p, all on the device (the same tokens, the draws being the CPU's
// streams; confidences within 2e-5: the device's exp and summation order), logits() within 1e-4 of the
// largest logit, and release() freeing the device memory that the next forward grows again; a step (the forward
// and its sampling) is one submission, a merged step of several requests' parts too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "batch_case.h"
#include "engine/device_head_sampler.h"
#include "engine/head_sampler.h"
#include "head_sampling_check.h"
#include "kernel_test_util.h"
#include "model/synthetic.h"
#include "synthetic_pair.h"
#include "vulkan_test_config.h"

namespace dc {
namespace {

// The tests' model: GQA (2 heads of 32, 1 KV head), a vocabulary of 300.
ModelConfig head_test_config() {
  return testing::vulkan_test_config(2, 1, 32, 160);
}

// A [B, L] canvas of tokens (i·mul + add) mod 298, every position's row out.
BatchCase canvas_of(int64_t B, int64_t L, int64_t mul, int64_t add) {
  return every_position(B, L, [&](int64_t i) { return (i * mul + add) % 298; });
}

TEST(DeviceHeadSampler, EqualsTheCpuSampler) {
  const ModelConfig c = head_test_config();
  const auto pair = testing::synthetic_pair(c, 5);
  ASSERT_NE(pair, nullptr);
  const Model &cpu_model = *pair->cpu_model, &device_model = *pair->device_model;
  const Context &cpu = pair->cpu, &device = pair->device;

  const int64_t B = 2, L = 9;
  const BatchCase canvas = canvas_of(B, L, 37, 11);
  const ForwardBatch batch = canvas.view();
  {
    DeviceHeadSampler on_device(device_model, device);
    CpuHeadSampler on_cpu(cpu_model, cpu);
    ASSERT_TRUE(on_device.forward(batch).ok());
    ASSERT_TRUE(on_cpu.forward(batch).ok());
    ASSERT_EQ(on_device.n_rows(), B * L);

    std::vector<HeadRow> rows;  // every hidden row, and row 4 twice (two positions reading one row)
    for (int64_t r = 0; r < B * L; ++r) {
      rows.push_back({r, r / L, r % L});
      if (r == 4) rows.push_back({r, r / L, r % L + 1});
    }
    const FilterConfig filters[] = {{0.0f, 1.0f, 0}, {0.0f, 1.0f, 5}, {0.7f, 0.9f, 0}, {1.0f, 1.0f, 0}, {0.8f, 0.95f, 20}};
    for (const FilterConfig& f : filters)
      for (ConfidenceKind kind : {ConfidenceKind::kProbability, ConfidenceKind::kMargin, ConfidenceKind::kNegEntropy}) {
        const HeadSampling args{f, kind, 42, 3, rows};
        std::vector<TokenSample> want(rows.size()), got(rows.size());
        ASSERT_TRUE(on_cpu.sample(args, want).ok());
        const Status s = on_device.sample(args, got);
        ASSERT_TRUE(s.ok()) << s.to_string();
        const std::string what = "T " + std::to_string(f.temperature) + " top_p " + std::to_string(f.top_p) + " top_k " + std::to_string(f.top_k) + " kind " +
                                 std::to_string(static_cast<int>(kind));
        for (size_t e = 0; e < rows.size(); ++e) {
          EXPECT_EQ(got[e].token, want[e].token) << what << " entry " << e;
          EXPECT_NEAR(got[e].confidence, want[e].confidence, 2e-5) << what << " entry " << e;
        }
      }

    const int64_t first = 3, n = 5, V = c.n_vocab;
    std::vector<float> want(n * V), got(n * V, NAN);
    ASSERT_TRUE(on_cpu.logits(first, n, want.data()).ok());
    ASSERT_TRUE(on_device.logits(first, n, got.data()).ok());
    testing::expect_close(want, got, 1e-4, "logits()");
    // A row's logits do not depend on how many rows are asked for with it (HeadSampler's contract), below
    // and above the 8 rows where the device's GEMM changes kernels; greedy sample() over 3 rows picks the
    // argmax of those logits.
    std::vector<float> all(B * L * V), few(4 * V);
    ASSERT_TRUE(on_device.logits(0, B * L, all.data()).ok());
    ASSERT_TRUE(on_device.logits(0, 4, few.data()).ok());
    EXPECT_TRUE(std::equal(few.begin(), few.end(), all.begin())) << "logits(0, 4) differ from logits(0, " << B * L << ")";
    const std::vector<HeadRow> three{{0, 0, 0}, {1, 0, 1}, {2, 0, 2}};
    std::vector<TokenSample> picked(three.size());
    ASSERT_TRUE(on_device.sample({filters[0], ConfidenceKind::kProbability, 42, 3, three}, picked).ok());
    for (int64_t r = 0; r < 3; ++r)
      EXPECT_EQ(picked[r].token, std::max_element(all.begin() + r * V, all.begin() + (r + 1) * V) - (all.begin() + r * V)) << "row " << r;

    // The logits block is kept between steps (grown only for more rows); release() frees it and the rows.
    const int64_t held = on_device.device_bytes();
    EXPECT_EQ(held, (B * L * c.n_embd + static_cast<int64_t>(rows.size()) * V) * 4);  // (more than 9 rows)
    const HeadSampling again{filters[2], ConfidenceKind::kMargin, 42, 3, rows};
    std::vector<TokenSample> before(rows.size()), after(rows.size());
    ASSERT_TRUE(on_device.sample(again, before).ok());
    EXPECT_EQ(on_device.device_bytes(), held);
    on_device.release();
    EXPECT_EQ(on_device.n_rows(), 0);
    EXPECT_EQ(on_device.device_bytes(), 0);
    ASSERT_TRUE(on_device.forward(batch).ok());
    ASSERT_TRUE(on_device.sample(again, after).ok());
    for (size_t e = 0; e < rows.size(); ++e) EXPECT_EQ(after[e].token, before[e].token) << "entry " << e;
  }  // the samplers' device memory goes before the backend
}

// A step is one submission (issue 35): forward() runs nothing (it checks the batch, refusing a bad one at
// once); the sample() after it runs the forward, the lm_head and the sampling in one submit, with the same
// tokens as a forward run on its own; a forward that no step reads runs alone at the next forward().
TEST(DeviceHeadSampler, AStepIsOneSubmission) {
  const auto pair = testing::synthetic_pair(head_test_config(), 6);
  ASSERT_NE(pair, nullptr);
  DeviceBackend& backend = *pair->backend;
  const int64_t L = 12;
  BatchCase canvas = canvas_of(1, L, 53, 7);
  std::vector<int32_t>& tokens = canvas.tokens;  // overwritten below: the view points into it
  const ForwardBatch batch = canvas.view();
  std::vector<HeadRow> rows;
  for (int64_t r = 0; r < L; ++r) rows.push_back({r, 0, r});
  const HeadSampling args{FilterConfig{0.0f, 1.0f, 0}, ConfidenceKind::kProbability, 1, 0, rows};
  {
    DeviceHeadSampler head(*pair->device_model, pair->device);
    std::vector<TokenSample> first(rows.size()), second(rows.size());
    const int64_t before = backend.counters().submits;
    ASSERT_TRUE(head.forward(batch).ok());
    EXPECT_EQ(backend.counters().submits, before) << "forward() submitted work of its own";
    ASSERT_TRUE(head.sample(args, first).ok());
    EXPECT_EQ(backend.counters().submits - before, 1);
    // A forward no step reads runs alone at the next forward(): three forwards and a step are three more
    // submits. forward() copies the batch: the caller's tokens, overwritten before the step, are not read.
    const std::vector<int32_t> original = tokens;
    ASSERT_TRUE(head.forward(batch).ok());
    std::fill(tokens.begin(), tokens.end(), 1);
    ASSERT_TRUE(head.forward(batch).ok());
    tokens = original;
    ASSERT_TRUE(head.forward(batch).ok());
    std::fill(tokens.begin(), tokens.end(), 1);
    ASSERT_TRUE(head.sample(args, second).ok());
    tokens = original;
    EXPECT_EQ(backend.counters().submits - before, 4);
    for (size_t e = 0; e < rows.size(); ++e) EXPECT_EQ(second[e].token, first[e].token) << "entry " << e;
    ForwardBatch bad = batch;
    std::vector<int32_t> bad_tokens(tokens.size(), 300);  // outside the vocabulary
    bad.tokens = bad_tokens.data();
    EXPECT_EQ(head.forward(bad).code(), StatusCode::kInvalidArgument);
  }  // the sampler's device memory goes before the backend
}

// A merged step (sample_parts): three requests' parts with their own filters, kinds, seeds and steps, one
// after a forward, are ONE submission (the forward, one lm_head product over every part's rows, a sampling
// dispatch per part at its offset, one download) and give each part exactly what sample() gives it alone.
TEST(DeviceHeadSampler, SamplePartsIsOneSubmissionAndEqualsEachPartAlone) {
  const auto pair = testing::synthetic_pair(head_test_config(), 7);
  ASSERT_NE(pair, nullptr);
  DeviceBackend& backend = *pair->backend;
  const int64_t L = 10;
  const BatchCase canvas = canvas_of(2, L, 41, 3);
  const auto rows_of = [&](int64_t first, int64_t last) {
    std::vector<HeadRow> rows;
    for (int64_t r = first; r < last; ++r) rows.push_back({r, r / L, r % L});
    return rows;
  };
  const std::vector<HeadRow> a = rows_of(0, 3), b = rows_of(3, 12), none, c = rows_of(14, 20);
  const std::vector<HeadSampling> parts = {{FilterConfig{0.0f, 1.0f, 5}, ConfidenceKind::kMargin, 1, 2, a},
                                           {FilterConfig{0.8f, 0.9f, 0}, ConfidenceKind::kNegEntropy, 7, 5, b},
                                           {FilterConfig{0.5f, 1.0f, 0}, ConfidenceKind::kProbability, 2, 2, none},
                                           {FilterConfig{1.0f, 1.0f, 20}, ConfidenceKind::kProbability, 3, 0, c}};
  {
    DeviceHeadSampler head(*pair->device_model, pair->device);
    std::vector<TokenSample> merged(a.size() + b.size() + c.size());
    std::vector<Status> status(parts.size(), internal_error("not written"));
    const int64_t before = backend.counters().submits;
    ASSERT_TRUE(head.forward(canvas.view()).ok());
    const Status s = head.sample_parts(parts, merged, status);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(backend.counters().submits - before, 1) << "a merged step took more than one submission";
    testing::expect_parts_equal_alone(head, parts, merged, status);
  }  // the sampler's device memory goes before the backend
}

}  // namespace
}  // namespace dc
