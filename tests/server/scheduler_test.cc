// The scheduler against dc::generate(): jobs of different lengths and settings decoded together (joining at
// step boundaries) give exactly the tokens each gives alone, with a fake model and with a tiny random
// checkpoint; jobs with a KV cache in one forward of parts; cancellation frees rows; queue limits, queue
// timeouts and early stops.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <new>
#include <span>
#include <thread>

#include "engine/engine.h"
#include "engine/head_sampler.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "sampler/fake_model.h"
#include "api/scheduler.h"
#include "server/scheduler_gate.h"

namespace dc::server {
namespace {

using namespace std::chrono_literals;
constexpr int64_t kVocab = 64;
constexpr int32_t kMask = 63, kPad = 62;

// Logits of row b at index i: a function of the row's REAL tokens up to i and their position ids, so that
// left padding changes nothing (as for the real model).
void fake_row(const ForwardBatch& batch, int64_t b, int64_t i, float* logits) {
  uint64_t h = 0;
  for (int64_t j = 0; j <= i; ++j) {
    const int64_t at = b * batch.n_seq + j;
    if (batch.valid != nullptr && batch.valid[at] == 0) continue;
    h = h * 1000003u + static_cast<uint64_t>(batch.tokens[at]) + 7;
  }
  const int64_t pos = batch.positions != nullptr ? batch.positions[b * batch.n_seq + i] : i;
  for (int64_t v = 0; v < kVocab; ++v) logits[v] = 3.0f * dc::testing::hash_unit(h, static_cast<uint64_t>(pos), v);
}

SamplingParams base_params() {
  SamplingParams p;
  p.mask_token_id = kMask;
  p.pad_token_id = kPad;
  p.top_k = 0;
  return p;
}

struct Case {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  auto add = [&](std::vector<int32_t> prompt, auto edit) {
    SamplingParams p = base_params();
    edit(p);
    cases.push_back({std::move(prompt), p});
  };
  add({1, 2, 3}, [](SamplingParams& p) { p.max_new_tokens = 8; p.steps = 8; p.alg = Algorithm::kEntropy; p.temperature = 0; });
  add({4, 5, 6, 7, 8, 9, 10}, [](SamplingParams& p) { p.max_new_tokens = 12; p.steps = 6; p.alg = Algorithm::kMaskgitPlus;
                                                      p.temperature = 0.7f; p.top_p = 0.9f; p.seed = 5; });
  add({11}, [](SamplingParams& p) { p.max_new_tokens = 5; p.steps = 5; p.alg = Algorithm::kOrigin; p.temperature = 1.0f;
                                    p.seed = 9; p.num_return_sequences = 2; });
  add({12, 13}, [](SamplingParams& p) { p.max_new_tokens = 16; p.steps = 16; p.alg = Algorithm::kTopkMargin;
                                        p.block_length = 4; p.temperature = 0.3f; p.seed = 1; });
  add({14, 15, 16, 17}, [](SamplingParams& p) { p.max_new_tokens = 10; p.alg = Algorithm::kEntropy; p.threshold = 0.2f;
                                                p.temperature = 0; });
  add({18, 19, 20}, [](SamplingParams& p) { p.max_new_tokens = 9; p.steps = 9; p.alg = Algorithm::kEntropy; p.alg_temp = 0.5f;
                                            p.temperature = 0.5f; p.seed = 3; });
  return cases;
}

TEST(Scheduler, BatchedEqualsAloneAndJoinsAtStepBoundaries) {
  const std::vector<Case> cases = mixed_cases();
  dc::testing::FakeModel model(kVocab, fake_row);
  Gate gate(head_fn_from_logits(model.logits_fn(), kVocab, nullptr));
  Metrics metrics;
  SchedulerOptions options;
  options.max_batch_rows = 16;
  Scheduler scheduler(gate.fn(), kVocab, logits_head_memory(kVocab), nullptr, options, &metrics);
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.push_back(std::make_shared<Job>(cases[0].prompt, cases[0].params, std::vector<int32_t>{}, true));
  ASSERT_EQ(scheduler.submit(jobs[0]), SubmitResult::kOk);
  gate.wait_entered();  // job 0 is in its first forward; the others join at the next step boundary
  for (size_t i = 1; i < cases.size(); ++i) {
    jobs.push_back(std::make_shared<Job>(cases[i].prompt, cases[i].params, std::vector<int32_t>{}, false));
    ASSERT_EQ(scheduler.submit(jobs[i]), SubmitResult::kOk);
  }
  gate.release();
  int64_t total_rows = 0;
  for (const Case& c : cases) total_rows += c.params.num_return_sequences;
  std::vector<JobSnapshot> snaps;
  for (size_t i = 0; i < cases.size(); ++i) {
    const JobResult r = wait_result(*jobs[i], i == 0 ? &snaps : nullptr);
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.to_string();
    dc::testing::FakeModel alone_model(kVocab, fake_row);
    auto alone = generate(alone_model.logits_fn(), kVocab, {cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    EXPECT_EQ(r.generated, alone->generated) << "job " << i << " differs when batched";
    EXPECT_EQ(r.timings.steps_run, alone->timings.steps_run) << i;
  }
  const std::vector<int64_t> rows = gate.rows();
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[0], 1);                                          // job 0 alone
  EXPECT_EQ(*std::max_element(rows.begin(), rows.end()), total_rows);  // then everyone in one forward
  ASSERT_EQ(snaps.size(), 8u);  // job 0 published a snapshot per step
  for (size_t s = 0; s < snaps.size(); ++s) EXPECT_EQ(snaps[s].step, static_cast<int>(s) + 1);
  EXPECT_GT(metrics.steps(), 0);
}

TEST(Scheduler, OneAtATimeGivesTheSameTokens) {
  const std::vector<Case> cases = mixed_cases();
  dc::testing::FakeModel model(kVocab, fake_row);
  SchedulerOptions options;
  options.max_batch_rows = 2;  // the job with n = 2 fills a batch alone
  Scheduler scheduler(head_fn_from_logits(model.logits_fn(), kVocab, nullptr), kVocab, logits_head_memory(kVocab),
                      nullptr, options, nullptr);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Case& c : cases) {
    jobs.push_back(std::make_shared<Job>(c.prompt, c.params, std::vector<int32_t>{}, false));
    ASSERT_EQ(scheduler.submit(jobs.back()), SubmitResult::kOk);
  }
  dc::testing::FakeModel alone_model(kVocab, fake_row);  // its own recorder: the scheduler thread is still running
  for (size_t i = 0; i < cases.size(); ++i) {
    const JobResult r = wait_result(*jobs[i]);
    ASSERT_TRUE(r.status.ok());
    auto alone = generate(alone_model.logits_fn(), kVocab, {cases[i].prompt}, cases[i].params);
    EXPECT_EQ(r.generated, alone->generated) << i;
  }
  for (const auto& b : model.batches()) EXPECT_LE(b.n_batch, 2);
}

TEST(Scheduler, CancelFreesTheRows) {
  dc::testing::FakeModel model(kVocab, fake_row);
  Gate gate(head_fn_from_logits(model.logits_fn(), kVocab, nullptr));
  Scheduler scheduler(gate.fn(), kVocab, logits_head_memory(kVocab), nullptr, SchedulerOptions{}, nullptr);
  SamplingParams p = base_params();
  p.max_new_tokens = 32;
  p.steps = 32;
  p.alg = Algorithm::kEntropy;
  auto a = std::make_shared<Job>(std::vector<int32_t>{1, 2}, p, std::vector<int32_t>{}, false);
  auto b = std::make_shared<Job>(std::vector<int32_t>{3}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(a), SubmitResult::kOk);
  gate.wait_entered();
  ASSERT_EQ(scheduler.submit(b), SubmitResult::kOk);
  a->cancel();
  gate.release();
  const JobResult ra = wait_result(*a);
  EXPECT_FALSE(ra.status.ok());
  EXPECT_NE(ra.status.message().find("cancelled"), std::string::npos);
  EXPECT_TRUE(is_cancelled(ra.status)) << ra.status.to_string();
  const JobResult rb = wait_result(*b);
  ASSERT_TRUE(rb.status.ok());
  const std::vector<int64_t> rows = gate.rows();
  ASSERT_GE(rows.size(), 3u);
  EXPECT_EQ(rows[0], 1);
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i], 1) << "the cancelled row stayed in forward " << i;
}

// The listener (the hub's wake for a stream) is called once per published step and once at the end, on the
// engine thread; one set after news is called at once.
TEST(Scheduler, ListenerIsCalledPerStepAndAtTheEnd) {
  dc::testing::FakeModel model(kVocab, fake_row);
  Scheduler scheduler(head_fn_from_logits(model.logits_fn(), kVocab, nullptr), kVocab, logits_head_memory(kVocab),
                      nullptr, SchedulerOptions{}, nullptr);
  SamplingParams p = base_params();
  p.max_new_tokens = 6;
  p.steps = 6;
  auto job = std::make_shared<Job>(std::vector<int32_t>{1, 2}, p, std::vector<int32_t>{}, true);
  std::atomic<int> calls{0};
  job->set_listener([&] { ++calls; });
  ASSERT_EQ(scheduler.submit(job), SubmitResult::kOk);
  std::vector<JobSnapshot> steps;
  ASSERT_TRUE(wait_result(*job, &steps).status.ok());
  EXPECT_EQ(steps.size(), 6u);
  for (int i = 0; i < 200 && calls.load() < 7; ++i) std::this_thread::sleep_for(5ms);  // (called after the wait ends)
  EXPECT_EQ(calls.load(), 7);  // 6 steps, then the end
  std::atomic<int> late{0};
  job->set_listener([&] { ++late; });
  EXPECT_EQ(late.load(), 1);  // the job has finished: news waiting
}

TEST(Scheduler, QueueFullTooLargeAndQueueTimeout) {
  dc::testing::FakeModel model(kVocab, fake_row);
  Gate gate(head_fn_from_logits(model.logits_fn(), kVocab, nullptr));
  SchedulerOptions options;
  options.max_batch_rows = 2;
  options.max_queue = 1;
  options.max_queue_seconds = 0.05;
  Scheduler scheduler(gate.fn(), kVocab, logits_head_memory(kVocab), nullptr, options, nullptr);
  SamplingParams p = base_params();
  p.max_new_tokens = 4;
  p.steps = 4;
  p.num_return_sequences = 2;
  auto a = std::make_shared<Job>(std::vector<int32_t>{1}, p, std::vector<int32_t>{}, false);
  auto b = std::make_shared<Job>(std::vector<int32_t>{2}, p, std::vector<int32_t>{}, false);
  auto c = std::make_shared<Job>(std::vector<int32_t>{3}, p, std::vector<int32_t>{}, false);
  SamplingParams big = p;
  big.num_return_sequences = 3;
  auto d = std::make_shared<Job>(std::vector<int32_t>{4}, big, std::vector<int32_t>{}, false);
  EXPECT_EQ(scheduler.submit(d), SubmitResult::kTooLarge);
  ASSERT_EQ(scheduler.submit(a), SubmitResult::kOk);
  gate.wait_entered();  // a fills the batch; b waits
  ASSERT_EQ(scheduler.submit(b), SubmitResult::kOk);
  EXPECT_EQ(scheduler.submit(c), SubmitResult::kQueueFull);
  EXPECT_FALSE(b->wait_admitted(100ms));  // still queued, past its time limit
  gate.release();
  EXPECT_TRUE(wait_result(*a).status.ok());
  const JobResult rb = wait_result(*b);
  EXPECT_TRUE(rb.queue_timeout);
  EXPECT_FALSE(rb.status.ok());
}

TEST(Scheduler, StopsEarlyWhenEveryRowHasAFinalStopToken) {
  // Every position prefers token 5 strongly: the first committed (leftmost-most-confident) tokens are 5s.
  auto row = [](const ForwardBatch&, int64_t, int64_t, float* logits) {
    for (int64_t v = 0; v < kVocab; ++v) logits[v] = v == 5 ? 10.0f : 0.0f;
  };
  dc::testing::FakeModel model(kVocab, row);
  Scheduler scheduler(head_fn_from_logits(model.logits_fn(), kVocab, nullptr), kVocab, logits_head_memory(kVocab),
                      nullptr, SchedulerOptions{}, nullptr);
  SamplingParams p = base_params();
  p.max_new_tokens = 16;
  p.steps = 16;
  p.alg = Algorithm::kEntropy;
  p.temperature = 0;
  auto job = std::make_shared<Job>(std::vector<int32_t>{1, 2}, p, std::vector<int32_t>{5}, false);
  ASSERT_EQ(scheduler.submit(job), SubmitResult::kOk);
  const JobResult r = wait_result(*job);
  ASSERT_TRUE(r.status.ok());
  EXPECT_TRUE(r.stopped_early);
  EXPECT_EQ(r.generated[0][0], 5);  // ties → lowest position first: position 0 commits first
  EXPECT_LT(r.timings.steps_run, 16);
}

// An engine over the first reference fixture (2 threads), or nullptr with a test failure.
std::unique_ptr<Engine> first_fixture_engine() {
  const auto manifest = dc::testing::load_manifest();
  if (manifest["models"].empty()) return nullptr;
  auto engine =
      testing::load_engine(dc::testing::fixtures_dir() + "/" + manifest["models"][0]["dir"].get<std::string>(), 2);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// `cases` on a scheduler over `e` whose batched forward is `gate`'s and whose cached jobs run through
// make_parts_fn's forwards of parts, the first job holding the gate (run_gated).
std::vector<JobResult> run_cases_gated(Engine& e, Gate& gate, const std::function<PartsHeadFn()>& make_parts_fn,
                                       const std::vector<Case>& cases) {
  Scheduler scheduler(gate.fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr,
                      [&e] { return e.head_fn(); }, make_parts_fn);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Case& c : cases) jobs.push_back(std::make_shared<Job>(c.prompt, c.params, std::vector<int32_t>{}, false));
  return run_gated(scheduler, gate, jobs);
}

TEST(Scheduler, TinyModelBatchedEqualsAlone) {
  const auto engine = first_fixture_engine();
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  std::vector<Case> cases;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = 6 + 2 * i;
    p.steps = 6;
    p.alg = i % 2 == 0 ? Algorithm::kEntropy : Algorithm::kMaskgitPlus;
    p.temperature = i < 2 ? 0.0f : 0.8f;
    p.seed = static_cast<uint64_t>(i);
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 4 * i; ++j) prompt.push_back(static_cast<int32_t>((37 * j + 11 * i) % 200 + 1));
    cases.push_back({prompt, p});
  }
  Gate gate(e.head_fn());
  Scheduler scheduler(gate.fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Case& c : cases) jobs.push_back(std::make_shared<Job>(c.prompt, c.params, std::vector<int32_t>{}, false));
  const std::vector<JobResult> results = run_gated(scheduler, gate, jobs);  // (different lengths: padded)
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.to_string();
    auto alone = e.generate({cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(results[i].generated, alone->generated) << "case " << i;
  }
  const std::vector<int64_t> rows = gate.rows();
  EXPECT_EQ(*std::max_element(rows.begin(), rows.end()), 4);  // all four were decoded together
}


// The review's finding: the batched head kept the largest batch's activations and hidden rows while the
// server sat idle. Once the last job of a batch is done the scheduler releases them (the release runs before
// the engine thread looks at the queue again, so it has happened when stop() has joined that thread).
TEST(Scheduler, IdleEngineHandsTheHeadsScratchBack) {
  const auto engine = first_fixture_engine();
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  Context ctx;
  ctx.pool = &e.pool();
  ctx.matmul_precision = e.matmul_precision();
  CpuHeadSampler head(e.model(), ctx);
  int64_t bytes_while_busy = 0;
  const HeadFn fn = [&head, &bytes_while_busy](const ForwardBatch& batch) -> Result<HeadSampler*> {
    bytes_while_busy = std::max(bytes_while_busy, head.workspace_bytes());  // the previous step's scratch
    DC_RETURN_IF_ERROR(head.forward(batch));
    return static_cast<HeadSampler*>(&head);
  };
  Scheduler scheduler(fn, e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr);
  SamplingParams p = e.default_params();
  p.max_new_tokens = 8;
  p.steps = 4;
  p.temperature = 0.0f;
  const std::vector<int32_t> prompt{5, 17, 42, 99};
  auto job = std::make_shared<Job>(prompt, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(job), SubmitResult::kOk);
  const JobResult r = wait_result(*job);
  scheduler.stop();
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_GT(bytes_while_busy, 0) << "the head held no scratch between steps: nothing was tested";
  EXPECT_EQ(head.workspace_bytes(), 0);
  EXPECT_EQ(head.n_rows(), 0);
  auto alone = e.generate({prompt}, p);  // the test's head gives what the engine's gives
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(r.generated, alone->generated);
}

// Jobs with a KV cache (serve --fast, or cache prefix / dual in the request) run their own forward with
// their own cache next to the batched one, and give exactly the tokens they give alone.
TEST(Scheduler, CachedJobsNextToBatchedOnesEqualAlone) {
  const auto engine = first_fixture_engine();
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  std::vector<Case> cases;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = 8 + 4 * i;
    p.steps = p.max_new_tokens.value();
    p.temperature = 0.0f;
    p.block_length = 4;
    if (i == 0) p.cache = CacheMode::kDual, p.threshold = 0.5f;  // one of each kind
    if (i == 1) p.cache = CacheMode::kPrefix;
    if (i == 2) apply_fast_mode(p);
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 2 * i; ++j) prompt.push_back(static_cast<int32_t>((29 * j + 7 * i) % 200 + 1));
    cases.push_back({prompt, p});
  }
  Scheduler scheduler(e.head_fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr,
                      [&e] { return e.head_fn(); });
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Case& c : cases) {
    jobs.push_back(std::make_shared<Job>(c.prompt, c.params, std::vector<int32_t>{}, false));
    ASSERT_EQ(scheduler.submit(jobs.back()), SubmitResult::kOk);
  }
  std::vector<JobResult> results;
  for (auto& j : jobs) results.push_back(wait_result(*j));
  scheduler.stop();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.to_string();
    auto alone = e.generate({cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    EXPECT_EQ(results[i].generated, alone->generated) << "case " << i;
    if (cases[i].params.cache != CacheMode::kNone) {
      EXPECT_GT(results[i].timings.cache_refreshes, 0) << "case " << i;
    }
  }
  // Without a factory such jobs fail cleanly.
  Scheduler plain(e.head_fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr);
  auto job = std::make_shared<Job>(cases[0].prompt, cases[0].params, std::vector<int32_t>{}, false);
  ASSERT_EQ(plain.submit(job), SubmitResult::kOk);
  EXPECT_EQ(wait_result(*job).status.code(), StatusCode::kUnimplemented);
}

// With a PartsHeadFn factory (Engine::parts_head_fn, the CPU) the cached jobs' steps run as ONE forward of
// parts per step (each over its own cache), next to the batched forward of the uncached job, and every job
// gives exactly the tokens it gives alone.
TEST(Scheduler, CachedJobsShareOneForwardOfPartsAndEqualAlone) {
  const auto engine = first_fixture_engine();
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  std::vector<Case> cases;
  for (int i = 0; i < 5; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = i == 0 ? 24 : 8 + 4 * i;  // the uncached job 0 runs longest: the others join its steps
    p.steps = p.max_new_tokens.value();
    p.temperature = i == 4 ? 0.7f : 0.0f;
    p.seed = 11;
    p.block_length = 4;
    if (i == 1) p.cache = CacheMode::kDual, p.threshold = 0.5f;
    if (i == 2) p.cache = CacheMode::kPrefix;
    if (i >= 3) apply_fast_mode(p);  // dual
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 3 * i; ++j) prompt.push_back(static_cast<int32_t>((31 * j + 5 * i) % 200 + 1));
    cases.push_back({prompt, p});
  }
  std::mutex mu;
  std::vector<size_t> parts_per_forward;  // of the forwards of parts
  const auto make_parts_fn = [&]() -> PartsHeadFn {
    return [&, inner = e.parts_head_fn()](std::span<const ForwardBatch> parts) {
      {
        std::lock_guard<std::mutex> lock(mu);
        parts_per_forward.push_back(parts.size());
      }
      return inner(parts);
    };
  };
  Gate gate(e.head_fn());
  const std::vector<JobResult> results = run_cases_gated(e, gate, make_parts_fn, cases);
  ASSERT_EQ(results.size(), cases.size());
  int64_t cached_forwards = 0;  // what the cached jobs ran alone: a forward each per step
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.to_string();
    auto alone = e.generate({cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    EXPECT_EQ(results[i].generated, alone->generated) << "case " << i;
    if (i > 0) {
      EXPECT_GT(results[i].timings.cache_refreshes, 0) << "case " << i;
      cached_forwards += results[i].timings.forwards;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(parts_per_forward.empty());
  EXPECT_EQ(*std::max_element(parts_per_forward.begin(), parts_per_forward.end()), 4u) << "the four cached jobs never shared a forward";
  int64_t parts = 0;
  for (size_t n : parts_per_forward) parts += static_cast<int64_t>(n);
  EXPECT_EQ(parts, cached_forwards);  // every cached job's forward was a part of one
  EXPECT_LT(static_cast<int64_t>(parts_per_forward.size()), cached_forwards);
}

}  // namespace
}  // namespace dc::server

namespace dc::server {
namespace {

// A HeadSampler that counts how its steps are drawn: sample() calls, and the parts of each sample_parts call.
class CountingHead final : public HeadSampler {
 public:
  HeadSampler* inner = nullptr;
  int64_t singles = 0;
  std::vector<size_t> merged;  // parts per sample_parts call
  int64_t n_rows() const override { return inner->n_rows(); }
  Status logits(int64_t first, int64_t n, float* out) override { return inner->logits(first, n, out); }
  Status sample(const HeadSampling& args, std::span<TokenSample> out) override {
    ++singles;
    return inner->sample(args, out);
  }
  Status sample_parts(std::span<const HeadSampling> parts, std::span<TokenSample> out, std::span<Status> status) override {
    merged.push_back(parts.size());
    return inner->sample_parts(parts, out, status);
  }
  void release() override { inner->release(); }
};

// Issue 35 item 5: the jobs of one forward (the batched one, the forward of parts) draw their step's tokens in
// ONE HeadSampler::sample_parts call over all their positions, each with its own settings (algorithm,
// temperature, top-p / top-k, seed), and give exactly the tokens each gives alone.
TEST(Scheduler, JobsOfOneForwardSampleInOneCallWithTheirOwnSettings) {
  const auto engine = first_fixture_engine();
  ASSERT_NE(engine, nullptr);
  Engine& e = *engine;
  std::vector<Case> cases;
  const Algorithm algs[] = {Algorithm::kEntropy, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin};
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = i == 0 ? 16 : 8 + (i % 3) * 2;  // job 0 (uncached, the gate) runs longest
    p.steps = p.max_new_tokens.value();
    p.alg = algs[i % 3];
    p.temperature = i % 3 == 0 ? 0.0f : 0.3f * static_cast<float>(i % 3 + 1);
    p.top_p = i % 2 == 0 ? 1.0f : 0.9f;
    p.top_k = i == 4 ? 5 : 0;
    p.seed = static_cast<uint64_t>(7 * i + 1);
    if (i >= 3) apply_fast_mode(p), p.block_length = 4;  // dual: the forward of parts
    std::vector<int32_t> prompt;
    for (int j = 0; j < 2 + 3 * i; ++j) prompt.push_back(static_cast<int32_t>((29 * j + 13 * i) % 200 + 1));
    cases.push_back({prompt, p});
  }
  CountingHead batched, parts_head;  // the engine thread's: read after run_gated stopped it
  const auto count = [](CountingHead& counter, Result<HeadSampler*> head) -> Result<HeadSampler*> {
    DC_RETURN_IF_ERROR(head.status());
    counter.inner = *head;
    return static_cast<HeadSampler*>(&counter);
  };
  Gate gate([&, inner = e.head_fn()](const ForwardBatch& b) { return count(batched, inner(b)); });
  const auto make_parts_fn = [&]() -> PartsHeadFn {
    return [&, inner = e.parts_head_fn()](std::span<const ForwardBatch> parts) { return count(parts_head, inner(parts)); };
  };
  const std::vector<JobResult> results = run_cases_gated(e, gate, make_parts_fn, cases);
  ASSERT_EQ(results.size(), cases.size());
  int64_t forwards = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.to_string();
    auto alone = e.generate({cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    EXPECT_EQ(results[i].generated, alone->generated) << "case " << i;
    forwards += results[i].timings.forwards;
  }
  for (const CountingHead* h : {&batched, &parts_head}) {
    ASSERT_FALSE(h->merged.empty()) << (h == &batched ? "batched" : "parts") << ": no merged step";
    EXPECT_EQ(*std::max_element(h->merged.begin(), h->merged.end()), 3u) << "three jobs never sampled in one call";
    EXPECT_GE(*std::min_element(h->merged.begin(), h->merged.end()), 2u) << "a job alone went through sample_parts";
  }
  // Every job's step was drawn once: alone by sample(), or as a part of one merged call.
  int64_t drawn = batched.singles + parts_head.singles;
  for (const CountingHead* h : {&batched, &parts_head})
    for (size_t n : h->merged) drawn += static_cast<int64_t>(n);
  EXPECT_EQ(drawn, forwards);
}

// A merged step where one job's logits are not finite fails that job alone (a model error naming its step, row
// and position); the jobs sampled in the same call get the tokens they get alone.
TEST(Scheduler, NonFiniteLogitsInAMergedStepFailOnlyTheirJob) {
  constexpr int32_t kPoison = 40;  // the first prompt token of the job whose logits are NaN
  dc::testing::FakeModel model(kVocab, fake_row);
  const LogitsFn good = model.logits_fn();
  const LogitsFn poisoned = [&](const ForwardBatch& batch, float* logits) -> Status {
    DC_RETURN_IF_ERROR(good(batch, logits));
    for (int64_t r = 0; r < batch.n_out; ++r) {
      const int64_t b = batch.out_rows[r] / batch.n_seq;
      int64_t first = 0;  // the row's first real token
      while (batch.valid != nullptr && batch.valid[b * batch.n_seq + first] == 0) ++first;
      if (batch.tokens[b * batch.n_seq + first] == kPoison) std::fill(logits + r * kVocab, logits + (r + 1) * kVocab, std::nanf(""));
    }
    return Status::ok_status();
  };
  Gate gate(head_fn_from_logits(poisoned, kVocab, nullptr));
  Scheduler scheduler(gate.fn(), kVocab, logits_head_memory(kVocab), nullptr, SchedulerOptions{}, nullptr);
  std::vector<Case> cases = mixed_cases();
  cases.resize(3);
  cases[1].prompt.insert(cases[1].prompt.begin(), kPoison);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Case& c : cases) jobs.push_back(std::make_shared<Job>(c.prompt, c.params, std::vector<int32_t>{}, false));
  const std::vector<JobResult> results = run_gated(scheduler, gate, jobs);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[1].model_error) << results[1].status.to_string();
  EXPECT_NE(results[1].status.to_string().find("step 0 row 0 position"), std::string::npos) << results[1].status.to_string();
  for (size_t i : {0u, 2u}) {
    ASSERT_TRUE(results[i].status.ok()) << "case " << i << ": " << results[i].status.to_string();
    auto alone = generate(good, kVocab, {cases[i].prompt}, cases[i].params);
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(results[i].generated, alone->generated) << "case " << i;
  }
  const std::vector<int64_t> rows = gate.rows();
  EXPECT_EQ(*std::max_element(rows.begin(), rows.end()), 4) << "the jobs never shared a step";
}

// Issue 23, items 1 and 14: memory running out on the engine thread fails that batch's jobs as
// `unavailable` (503) and the thread serves the next job; NaN logits fail a job as a model error (500).
TEST(Scheduler, OutOfMemoryAndModelErrorsFailTheJobNotTheThread) {
  dc::testing::FakeModel model(kVocab, fake_row);
  LogitsFn good = model.logits_fn();
  std::atomic<int> calls{0};
  LogitsFn flaky = [&](const ForwardBatch& batch, float* logits) -> Status {
    const int call = calls++;
    if (call == 0) throw std::bad_alloc();
    if (call == 1) {
      for (int64_t i = 0; i < batch.n_out * kVocab; ++i) logits[i] = std::nanf("");
      return Status::ok_status();
    }
    return good(batch, logits);
  };
  Scheduler scheduler(head_fn_from_logits(flaky, kVocab, nullptr), kVocab, logits_head_memory(kVocab), nullptr,
                      SchedulerOptions{}, nullptr);
  SamplingParams p = base_params();
  p.max_new_tokens = 4;
  p.steps = 4;
  p.alg = Algorithm::kEntropy;
  auto a = std::make_shared<Job>(std::vector<int32_t>{1, 2}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(a), SubmitResult::kOk);
  const JobResult ra = wait_result(*a);
  EXPECT_FALSE(ra.status.ok());
  EXPECT_TRUE(ra.unavailable) << ra.status.to_string();
  auto b = std::make_shared<Job>(std::vector<int32_t>{3}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(b), SubmitResult::kOk);
  const JobResult rb = wait_result(*b);
  EXPECT_FALSE(rb.status.ok());
  EXPECT_TRUE(rb.model_error) << rb.status.to_string();
  EXPECT_FALSE(rb.unavailable);
  auto c = std::make_shared<Job>(std::vector<int32_t>{4}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(c), SubmitResult::kOk);
  EXPECT_TRUE(wait_result(*c).status.ok()) << "the engine thread still serves";
}

// A forward that reports running out of memory (a device's KV cache or activations: kResourceExhausted, no
// exception) fails its jobs as `unavailable` (503), not as a model error (500).
TEST(Scheduler, AForwardOutOfMemoryIsUnavailableNotAModelError) {
  dc::testing::FakeModel model(kVocab, fake_row);
  LogitsFn good = model.logits_fn();
  std::atomic<int> calls{0};
  LogitsFn short_of_memory = [&](const ForwardBatch& batch, float* logits) -> Status {
    if (calls++ == 0) return resource_exhausted("vulkan:0: out of device memory for the KV cache");
    return good(batch, logits);
  };
  Scheduler scheduler(head_fn_from_logits(short_of_memory, kVocab, nullptr), kVocab, logits_head_memory(kVocab),
                      nullptr, SchedulerOptions{}, nullptr);
  SamplingParams p = base_params();
  p.max_new_tokens = 4;
  p.steps = 4;
  auto a = std::make_shared<Job>(std::vector<int32_t>{1, 2}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(a), SubmitResult::kOk);
  const JobResult ra = wait_result(*a);
  EXPECT_EQ(ra.status.code(), StatusCode::kResourceExhausted) << ra.status.to_string();
  EXPECT_TRUE(ra.unavailable);
  EXPECT_FALSE(ra.model_error);
  auto b = std::make_shared<Job>(std::vector<int32_t>{3}, p, std::vector<int32_t>{}, false);
  ASSERT_EQ(scheduler.submit(b), SubmitResult::kOk);
  EXPECT_TRUE(wait_result(*b).status.ok());
}

// On a device the budget also weighs the forward's activations per canvas position and, for a job with a KV
// cache only, the cache's bytes per position (HeadMemory's device fields); on the CPU those are 0.
TEST(Scheduler, JobMemoryCountsTheDevicesActivationsAndKvCache) {
  SamplingParams p = base_params();
  p.max_new_tokens = 8;
  p.num_return_sequences = 2;
  const int64_t prompt = 4, n_seq = 12, window = 8;
  const HeadMemory cpu{100, 1000};
  const HeadMemory device{100, 0, 7, 11};
  EXPECT_EQ(api::job_memory_bytes(p, prompt, cpu), 2 * window * 100 + 2 * n_seq * 16);
  EXPECT_EQ(api::job_memory_bytes(p, prompt, device), 2 * window * 100 + 2 * n_seq * (16 + 7));
  p.cache = CacheMode::kDual;
  p.block_length = 4;
  EXPECT_EQ(api::job_memory_bytes(p, prompt, cpu), 2 * 4 * 100 + 2 * n_seq * 16);
  EXPECT_EQ(api::job_memory_bytes(p, prompt, device), 2 * 4 * 100 + 2 * n_seq * (16 + 7 + 11));
}

}  // namespace
}  // namespace dc::server
