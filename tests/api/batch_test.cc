// The public BatchEngine (include/diffucoder/batch.h) on a tiny reference checkpoint: two requests merged in one
// batched forward give the tokens each gives alone through Model::generate, cancel ends a running request,
// and every refusal of submit and create comes with its code and a message naming the field or the limit; the
// server's parsed SamplingParams reach the engine unchanged through the public GenerationConfig.
#include <gtest/gtest.h>

#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/config.h"
#include "api/model_impl.h"
#include "fixtures.h"

// (GCC 12 warns of the fields a designated initializer leaves to their defaults, which is what these requests mean)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace {

using diffucoder::BatchEngine;
using diffucoder::BatchRequest;
using diffucoder::BatchResult;
using diffucoder::GenerationConfig;
using diffucoder::Model;
using diffucoder::SubmitCode;
using namespace std::chrono_literals;

std::unique_ptr<Model> batch_test_model() {
  diffucoder::LoadOptions o;
  o.model_dir = dc::testing::fixtures_dir() + "/tiny-gqa2";
  o.threads = 2;
  o.precision = "f32";
  o.weight_cache = "off";
  auto m = Model::load(o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

GenerationConfig greedy_config(const Model& model, int64_t new_tokens, int steps) {
  GenerationConfig c = model.default_config();
  c.alg = "entropy";
  c.temperature = 0;
  c.max_new_tokens = new_tokens;
  c.steps = steps;
  return c;
}

// Counts the batch's steps and rows; its first on_step waits until release() (so that requests submitted
// meanwhile join the next step's batch) after saying it was entered.
class GatedObserver : public diffucoder::BatchObserver {
 public:
  void on_step(double, double, int64_t rows, int64_t) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, 30s, [&] { return open_; });
    step_rows_.push_back(rows);
  }
  void on_job_done(double, double) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++jobs_done_;
  }
  void set_queue_depth(int64_t) override {}
  void set_active_rows(int64_t) override {}

  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, 30s, [&] { return entered_; }));
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::vector<int64_t> step_rows() {
    std::lock_guard<std::mutex> lock(mu_);
    return step_rows_;
  }
  int jobs_done() {
    std::lock_guard<std::mutex> lock(mu_);
    return jobs_done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, open_ = false;
  std::vector<int64_t> step_rows_;
  int jobs_done_ = 0;
};

TEST(BatchEngine, MergedRequestsGiveTheTokensOfEachAlone) {
  auto model = batch_test_model();
  ASSERT_NE(model, nullptr);
  GatedObserver observer;
  auto engine = BatchEngine::create(*model, {}, &observer);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  // Different prompt lengths (the merged forward left-pads the shorter) and lengths; a has the most steps, so
  // it is still running when b joins after a's first step.
  BatchRequest a{.prompt = {5, 9, 14, 3, 7, 21, 2}, .config = greedy_config(*model, 12, 12)};
  BatchRequest b{.prompt = {11, 4, 8}, .config = greedy_config(*model, 8, 6)};
  b.config.num_return_sequences = 2;
  diffucoder::Submission sa = (*engine)->submit(a);
  ASSERT_EQ(sa.code, SubmitCode::kOk) << sa.status.to_string();
  observer.wait_entered();  // a's first step is done; b waits for the next step boundary
  diffucoder::Submission sb = (*engine)->submit(b);
  ASSERT_EQ(sb.code, SubmitCode::kOk) << sb.status.to_string();
  observer.release();
  const BatchResult ra = sa.job->wait(), rb = sb.job->wait();
  ASSERT_TRUE(ra.status.ok()) << ra.status.to_string();
  ASSERT_TRUE(rb.status.ok()) << rb.status.to_string();
  const std::vector<int64_t> rows = observer.step_rows();
  EXPECT_EQ(rows.front(), 1);
  EXPECT_NE(std::find(rows.begin(), rows.end(), 3), rows.end()) << "b's two rows never joined a's step";
  EXPECT_EQ(observer.jobs_done(), 2);

  for (const auto& [request, result] : {std::pair{&a, &ra}, std::pair{&b, &rb}}) {
    auto alone = model->generate({request->prompt}, request->config);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    ASSERT_EQ(result->generated.size(), static_cast<size_t>(alone->n_rows));
    for (int64_t r = 0; r < alone->n_rows; ++r) EXPECT_EQ(result->generated[r], alone->generated(r)) << "row " << r;
  }
}

TEST(BatchEngine, CancelEndsARunningRequestAndPublishesSteps) {
  auto model = batch_test_model();
  ASSERT_NE(model, nullptr);
  GatedObserver observer;
  auto engine = BatchEngine::create(*model, {}, &observer);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  BatchRequest req{.prompt = {5, 9, 14}, .config = greedy_config(*model, 16, 16), .publish_steps = true};
  diffucoder::Submission s = (*engine)->submit(req);
  ASSERT_EQ(s.code, SubmitCode::kOk) << s.status.to_string();
  observer.wait_entered();  // one step run, the engine waits in its report of it
  s.job->cancel();
  observer.release();
  std::vector<diffucoder::BatchStep> steps;
  BatchResult r;
  while (!s.job->wait(1000ms, &steps, &r)) {
  }
  EXPECT_EQ(r.status.code(), diffucoder::StatusCode::kCancelled) << r.status.to_string();
  EXPECT_TRUE(s.job->cancelled());
  ASSERT_EQ(steps.size(), 1u);  // the one step before the cancel
  EXPECT_EQ(steps[0].step, 1);
  EXPECT_EQ(steps[0].n_steps, 16);
  ASSERT_EQ(steps[0].rows.size(), 1u);
  EXPECT_EQ(steps[0].rows[0].size(), 16u);
  EXPECT_LT(r.steps_run, 16);
}

TEST(BatchEngine, RefusalsHaveTheirCodeAndNameTheField) {
  auto model = batch_test_model();
  ASSERT_NE(model, nullptr);
  const GenerationConfig ok_config = greedy_config(*model, 8, 8);

  diffucoder::BatchOptions o;
  o.max_batch_rows = 1;
  auto engine = BatchEngine::create(*model, o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  BatchRequest two_rows{.prompt = {5, 9}, .config = ok_config};
  two_rows.config.num_return_sequences = 2;
  diffucoder::Submission s = (*engine)->submit(two_rows);
  EXPECT_EQ(s.code, SubmitCode::kTooLarge);
  EXPECT_EQ(s.job, nullptr);
  EXPECT_NE(s.status.message().find("max_batch_rows 1"), std::string::npos) << s.status.message();

  BatchRequest bad_alg{.prompt = {5, 9}, .config = ok_config};
  bad_alg.config.alg = "nope";
  s = (*engine)->submit(bad_alg);
  EXPECT_EQ(s.code, SubmitCode::kInvalid);
  EXPECT_EQ(s.status.code(), diffucoder::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status.message().find("nope"), std::string::npos) << s.status.message();
  BatchRequest bad_id{.prompt = {5, static_cast<int32_t>(model->info().n_vocab)}, .config = ok_config};
  s = (*engine)->submit(bad_id);
  EXPECT_EQ(s.code, SubmitCode::kInvalid);
  EXPECT_NE(s.status.message().find("prompt"), std::string::npos) << s.status.message();
  BatchRequest bad_adapter{.prompt = {5, 9}, .config = ok_config, .adapter = "sql"};
  s = (*engine)->submit(bad_adapter);
  EXPECT_EQ(s.code, SubmitCode::kInvalid);
  EXPECT_EQ(s.status.code(), diffucoder::StatusCode::kNotFound);
  EXPECT_NE(s.status.message().find("adapter: 'sql'"), std::string::npos) << s.status.message();

  (*engine)->stop();
  s = (*engine)->submit(BatchRequest{.prompt = {5, 9}, .config = ok_config});
  EXPECT_EQ(s.code, SubmitCode::kStopped);

  o = {};
  o.max_queue = 0;
  engine = BatchEngine::create(*model, o);
  ASSERT_TRUE(engine.ok());
  s = (*engine)->submit(BatchRequest{.prompt = {5, 9}, .config = ok_config});
  EXPECT_EQ(s.code, SubmitCode::kQueueFull);
  EXPECT_EQ(s.status.code(), diffucoder::StatusCode::kResourceExhausted);

  // A budget of exactly the head's block: every request needs more than that.
  o = {};
  engine = BatchEngine::create(*model, o);
  ASSERT_TRUE(engine.ok());
  const int64_t head = (*engine)->head_block_bytes();
  ASSERT_GT(head, 0);
  const BatchRequest one{.prompt = {5, 9}, .config = ok_config};
  auto need = (*engine)->memory_needed(one);
  ASSERT_TRUE(need.ok()) << need.status().to_string();
  EXPECT_GT(*need, head);
  o.max_memory_bytes = head;
  engine = BatchEngine::create(*model, o);
  ASSERT_TRUE(engine.ok());
  s = (*engine)->submit(one);
  EXPECT_EQ(s.code, SubmitCode::kOverMemory);
  EXPECT_NE(s.status.message().find("max_memory_bytes"), std::string::npos) << s.status.message();

  o.max_memory_bytes = head - 1;
  auto refused = BatchEngine::create(*model, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), diffucoder::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message().rfind("max_memory_bytes:", 0), 0u) << refused.status().message();
  o = {};
  o.max_batch_rows = 0;
  refused = BatchEngine::create(*model, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().rfind("max_batch_rows:", 0), 0u) << refused.status().message();
}

TEST(BatchEngine, GenerationConfigCarriesEverySamplingParam) {
  dc::SamplingParams base;
  base.max_position_embeddings = 4096;
  dc::SamplingParams p = base;  // every field away from its default
  p.max_new_tokens = 77;
  p.max_length = 300;
  p.steps = 33;
  p.eps = 0.01f;
  p.alg = dc::Algorithm::kTopkMargin;
  p.alg_temp = 0.5f;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  p.top_k = 12;
  p.num_return_sequences = 3;
  p.seed = 99;
  p.output_history = true;
  p.mask_token_id = 17;
  p.pad_token_id = 18;
  p.block_length = 8;
  p.cache = dc::CacheMode::kPrefix;
  p.factor = 0.25f;
  const dc::Result<dc::SamplingParams> back = dc::api::sampling_params(base, dc::api::generation_config(p));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->max_new_tokens, p.max_new_tokens);
  EXPECT_EQ(back->max_length, p.max_length);
  EXPECT_EQ(back->max_position_embeddings, p.max_position_embeddings);
  EXPECT_EQ(back->steps, p.steps);
  EXPECT_EQ(back->eps, p.eps);
  EXPECT_EQ(back->alg, p.alg);
  EXPECT_EQ(back->alg_temp, p.alg_temp);
  EXPECT_EQ(back->temperature, p.temperature);
  EXPECT_EQ(back->top_p, p.top_p);
  EXPECT_EQ(back->top_k, p.top_k);
  EXPECT_EQ(back->num_return_sequences, p.num_return_sequences);
  EXPECT_EQ(back->seed, p.seed);
  EXPECT_EQ(back->output_history, p.output_history);
  EXPECT_EQ(back->mask_token_id, p.mask_token_id);
  EXPECT_EQ(back->pad_token_id, p.pad_token_id);
  EXPECT_EQ(back->block_length, p.block_length);
  EXPECT_EQ(back->cache, p.cache);
  EXPECT_EQ(back->threshold, p.threshold);
  EXPECT_EQ(back->factor, p.factor);
  p.factor = 0;
  p.threshold = 0.8f;
  p.cache = dc::CacheMode::kDual;
  const dc::Result<dc::SamplingParams> dual = dc::api::sampling_params(base, dc::api::generation_config(p));
  ASSERT_TRUE(dual.ok());
  EXPECT_EQ(dual->threshold, p.threshold);
  EXPECT_EQ(dual->cache, p.cache);
}

}  // namespace
