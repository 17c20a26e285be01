// A forward of several parts on the device (Model::forward_hidden_parts with a Vulkan context; device 0:
// lavapipe in CI): refresh, kUse and uncached parts of their own shapes (rows and windows not multiples of the
// attention's tile, a padded part) in one forward and one submission give each part's rows within 1e-5 relative
// of the part alone on the device and of the CPU's forward of the same parts (f32, the reference kernels), and
// fill each part's own cache (the kUse step after the refresh reads them); the head's step over them is one
// submission with each part's own tokens; bad parts are refused naming the part.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "batch_case.h"
#include "engine/device_head_sampler.h"
#include "model/kv_cache.h"
#include "synthetic_pair.h"
#include "vulkan_test_config.h"

namespace dc {
namespace {

// max |got − want| / max |want| (infinite when a value is NaN).
double parts_rel_error(const std::vector<float>& want, const std::vector<float>& got) {
  double max_ref = 1e-30, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  return max_diff / max_ref;
}

// forward_hidden_parts over `parts` on ctx's device: the hidden rows [Σ n_out, n_embd] (downloaded from the
// device), or the error in *status. *submits: the device's queue submissions it took.
std::vector<float> hidden_of(const Model& model, const Context& ctx, std::span<const ForwardBatch> parts, Status* status,
                             int64_t* submits = nullptr) {
  int64_t n_out = 0;
  for (const ForwardBatch& b : parts) n_out += b.n_out;
  const int64_t bytes = n_out * model.config().n_embd * static_cast<int64_t>(sizeof(float));
  std::vector<float> hidden(static_cast<size_t>(bytes / 4), NAN);
  if (ctx.device == Device::kCpu) {
    *status = model.forward_hidden_parts(ctx, parts, hidden.data());
    return hidden;
  }
  std::unique_ptr<DeviceMemory> rows;
  {
    const std::unique_lock<std::mutex> lock = ctx.backend->lock();
    rows = ctx.backend->allocate(bytes, "the test's hidden rows").value();
  }
  const int64_t before = ctx.backend->counters().submits;
  *status = model.forward_hidden_parts(ctx, parts, as_operand(rows->data()));
  if (submits != nullptr) *submits = ctx.backend->counters().submits - before;
  if (!status->ok()) return hidden;
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  EXPECT_TRUE(ctx.backend->begin().ok());
  ctx.backend->copy_out("test.hidden", rows->data(), hidden.data(), bytes);
  EXPECT_TRUE(ctx.backend->finish().ok());
  return hidden;
}

// The parts one after the other, each alone (a forward of its own) on ctx's device.
std::vector<float> each_alone(const Model& model, const Context& ctx, std::span<const ForwardBatch> parts) {
  std::vector<float> all;
  for (const ForwardBatch& part : parts) {
    Status s;
    const std::vector<float> h = hidden_of(model, ctx, {&part, 1}, &s);
    EXPECT_TRUE(s.ok()) << s.to_string();
    all.insert(all.end(), h.begin(), h.end());
  }
  return all;
}

void expect_parts_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  const double rel = parts_rel_error(want, got);
  std::printf("  %s: rel max diff %.2e\n", what.c_str(), rel);
  EXPECT_LE(rel, 1e-5) << what;
}

ModelConfig parts_config() { return testing::vulkan_test_config(4, 2, 16, 96); }

TEST(PartsVulkan, OneForwardOfPartsEqualsEachPartAloneAndTheCpu) {
  const ModelConfig c = parts_config();
  const auto pair = testing::synthetic_pair(c, 7);
  ASSERT_NE(pair, nullptr);
  const Model &cpu_model = *pair->cpu_model, &device_model = *pair->device_model;
  const Context &cpu = pair->cpu, &device = pair->device;
  // 12, 17 (two rows, the second left-padded) and 9 positions: none a multiple of the attention's tile.
  BatchCase a = make_canvas(c, 1, 12, 5), b = make_canvas(c, 2, 17, 9), u = make_canvas(c, 1, 9, 2);
  const std::vector<int64_t> rows_a = window_rows(a, 0, a.L), rows_b = window_rows(b, 0, b.L), rows_u = window_rows(u, 0, u.L);
  // Per cache: the merged forward's on the device, each part alone on the device, the CPU's merged forward's.
  KvCache merged_a, merged_b, alone_a, alone_b, cpu_a, cpu_b;
  const auto refresh = [&](KvCache& ca, KvCache& cb) {
    return std::vector<ForwardBatch>{a.view(rows_a, CacheOp::kRefresh, &ca), u.view(rows_u, CacheOp::kNone, nullptr),
                                     b.view(rows_b, CacheOp::kRefresh, &cb)};
  };
  Status s;
  int64_t submits = 0;
  const std::vector<float> merged = hidden_of(device_model, device, refresh(merged_a, merged_b), &s, &submits);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(submits, 1) << "a forward of parts is one submission";
  expect_parts_close(each_alone(device_model, device, refresh(alone_a, alone_b)), merged, "refresh parts against each alone on the device");
  const std::vector<float> on_cpu = hidden_of(cpu_model, cpu, refresh(cpu_a, cpu_b), &s);
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_parts_close(on_cpu, merged, "refresh parts against the CPU's");
  for (const KvCache* cache : {&merged_a, &merged_b}) {
    EXPECT_TRUE(cache->filled());
    EXPECT_EQ(cache->backend(), device.backend);
  }

  // The next steps: kUse windows of 4 and 7 positions over each part's own cache after their tokens changed,
  // with an uncached part between them (a wrong cache or a wrong offset into the stacked rows shows here).
  for (int64_t i = 6; i < 10; ++i) a.tokens[i] = b.tokens[b.L + i + 3] = 17;
  const std::vector<int64_t> use_a = window_rows(a, 6, 10), use_b = window_rows(b, 8, 15);
  const auto use = [&](KvCache& ca, KvCache& cb) {
    return std::vector<ForwardBatch>{a.view(use_a, CacheOp::kUse, &ca, 6, 10), u.view(rows_u, CacheOp::kNone, nullptr),
                                     b.view(use_b, CacheOp::kUse, &cb, 8, 15)};
  };
  const std::vector<float> merged_use = hidden_of(device_model, device, use(merged_a, merged_b), &s, &submits);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(submits, 1);
  expect_parts_close(each_alone(device_model, device, use(alone_a, alone_b)), merged_use, "kUse parts against each alone on the device");
  const std::vector<float> cpu_use = hidden_of(cpu_model, cpu, use(cpu_a, cpu_b), &s);
  ASSERT_TRUE(s.ok()) << s.to_string();
  expect_parts_close(cpu_use, merged_use, "kUse parts against the CPU's");
}

// The head over a forward of parts (DeviceHeadSampler::forward(parts), the server's cached requests): the
// forward, the lm_head and the sampling of every part's rows are one submission, and each part's greedy tokens
// are those of its own forward through a head of its own.
TEST(PartsVulkan, AStepOfPartsIsOneSubmissionWithEachPartsTokens) {
  const ModelConfig c = parts_config();
  const auto pair = testing::synthetic_pair(c, 11);
  ASSERT_NE(pair, nullptr);
  const BatchCase a = make_canvas(c, 1, 11, 4), b = make_canvas(c, 2, 13, 6);
  const std::vector<int64_t> rows_a = window_rows(a, 0, a.L), rows_b = window_rows(b, 0, b.L);
  const auto greedy = [](DeviceHeadSampler& head, int64_t n) {
    std::vector<HeadRow> rows;
    for (int64_t r = 0; r < n; ++r) rows.push_back({r, 0, r});
    std::vector<TokenSample> out(rows.size());
    const Status s = head.sample({FilterConfig{0.0f, 1.0f, 0}, ConfidenceKind::kProbability, 1, 0, rows}, out);
    EXPECT_TRUE(s.ok()) << s.to_string();
    std::vector<int32_t> tokens;
    for (const TokenSample& t : out) tokens.push_back(t.token);
    return tokens;
  };
  KvCache merged_a, merged_b, alone_a, alone_b;
  std::vector<int32_t> want;
  for (const ForwardBatch& part : {a.view(rows_a, CacheOp::kRefresh, &alone_a), b.view(rows_b, CacheOp::kRefresh, &alone_b)}) {
    DeviceHeadSampler alone(*pair->device_model, pair->device);
    ASSERT_TRUE(alone.forward(part).ok());
    const std::vector<int32_t> t = greedy(alone, part.n_out);
    want.insert(want.end(), t.begin(), t.end());
  }
  DeviceHeadSampler head(*pair->device_model, pair->device);
  const ForwardBatch parts[] = {a.view(rows_a, CacheOp::kRefresh, &merged_a), b.view(rows_b, CacheOp::kRefresh, &merged_b)};
  const int64_t before = pair->backend->counters().submits;
  ASSERT_TRUE(head.forward(parts).ok());
  EXPECT_EQ(head.n_rows(), static_cast<int64_t>(want.size()));
  EXPECT_EQ(greedy(head, head.n_rows()), want);
  EXPECT_EQ(pair->backend->counters().submits - before, 1) << "the step of parts took more than one submission";
  EXPECT_TRUE(merged_a.filled() && merged_b.filled());
  KvCache shared;
  const ForwardBatch same_cache[] = {a.view(rows_a, CacheOp::kRefresh, &shared), b.view(rows_b, CacheOp::kRefresh, &shared)};
  EXPECT_EQ(head.forward(same_cache).code(), StatusCode::kInvalidArgument);
}

TEST(PartsVulkan, BadPartsAreRefusedNamingThePart) {
  const ModelConfig c = parts_config();
  const auto pair = testing::synthetic_pair(c, 3);
  ASSERT_NE(pair, nullptr);
  const Context& device = pair->device;
  const BatchCase a = make_canvas(c, 1, 8, 1);
  const std::vector<int64_t> rows = window_rows(a, 0, a.L), window = window_rows(a, 2, 4);
  Status s;
  KvCache shared, unfilled, on_host;
  const ForwardBatch same_cache[] = {a.view(rows, CacheOp::kRefresh, &shared), a.view(rows, CacheOp::kRefresh, &shared)};
  hidden_of(*pair->device_model, device, same_cache, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("parts 0 and 1 share a KV cache"), std::string::npos) << s.to_string();
  const ForwardBatch not_filled[] = {a.view(rows, CacheOp::kNone, nullptr), a.view(window, CacheOp::kUse, &unfilled, 2, 4)};
  hidden_of(*pair->device_model, device, not_filled, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("part 1"), std::string::npos) << s.to_string();
  // A cache the CPU filled, read by part 2 of a device forward.
  const ForwardBatch fill = a.view(rows, CacheOp::kRefresh, &on_host);
  hidden_of(*pair->cpu_model, pair->cpu, {&fill, 1}, &s);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const ForwardBatch cpu_cache[] = {a.view(rows, CacheOp::kNone, nullptr), a.view(rows, CacheOp::kNone, nullptr),
                                    a.view(window, CacheOp::kUse, &on_host, 2, 4)};
  hidden_of(*pair->device_model, device, cpu_cache, &s);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.to_string().find("part 2"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("filled on the CPU"), std::string::npos) << s.to_string();
  EXPECT_EQ(pair->device_model->forward_hidden_parts(device, {}, nullptr).code(), StatusCode::kInvalidArgument);
  // The device still runs good parts after the refusals.
  const ForwardBatch good[] = {a.view(rows, CacheOp::kNone, nullptr), a.view(rows, CacheOp::kRefresh, &shared)};
  hidden_of(*pair->device_model, device, good, &s);
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace dc
