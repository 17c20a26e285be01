// Concurrent generations: two threads generating on one engine (one shared thread pool) and on two
// engines give the same tokens as the same generations run one after the other; set_matmul_precision
// against a generation on another thread. CI also runs these
// under ThreadSanitizer (scripts/test.sh --tsan), where a data race fails the run.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "model/synthetic.h"

namespace dc {
namespace {

// A small synthetic model (random bf16 weights), wide enough that the forward's parallel_for calls
// split into several chunks.
std::unique_ptr<Engine> make_engine(int n_threads) {
  ModelConfig config = synthetic_config("tiny").value();
  config.n_embd = 128, config.n_ff = 256, config.n_head = 4, config.n_head_kv = 2, config.n_layer = 2;
  config.head_dim = config.n_embd / config.n_head;
  ThreadPool fill_pool(1);
  auto model = make_synthetic_model(config, 7, &fill_pool);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  return Engine::from_model(std::move(*model), n_threads);
}

struct Job {
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams params;
};

// Generations that differ in prompts, sampling (greedy and seeded), algorithm and KV cache mode.
std::vector<Job> make_jobs(const Engine& engine) {
  std::vector<Job> jobs;
  for (int j = 0; j < 4; ++j) {
    Job job;
    for (int p = 0; p < 1 + j % 2; ++p) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 5 + 3 * p + j; ++i) prompt.push_back(static_cast<int32_t>((97 * (i + 1) + 31 * j + p) % 4000));
      job.prompts.push_back(prompt);
    }
    job.params = engine.default_params();
    job.params.max_new_tokens = 24;
    job.params.steps = 12;
    job.params.alg = j % 2 == 0 ? Algorithm::kEntropy : Algorithm::kOrigin;
    job.params.temperature = j < 2 ? 0.0f : 0.8f;
    job.params.seed = 11 + j;
    if (j == 1 || j == 3) {
      job.params.block_length = 8;
      job.params.cache = j == 1 ? CacheMode::kDual : CacheMode::kPrefix;
    }
    jobs.push_back(job);
  }
  return jobs;
}

std::vector<std::vector<int32_t>> run(Engine& engine, const Job& job) {
  auto out = engine.generate(job.prompts, job.params);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->sequences : std::vector<std::vector<int32_t>>{};
}

TEST(Concurrency, TwoThreadsOnOneEngineMatchOneAfterTheOther) {
  std::unique_ptr<Engine> engine = make_engine(3);
  const std::vector<Job> jobs = make_jobs(*engine);
  std::vector<std::vector<std::vector<int32_t>>> want;
  for (const Job& job : jobs) want.push_back(run(*engine, job));
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<std::vector<int32_t>>> got(jobs.size());
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&, t] {
        for (size_t j = t; j < jobs.size(); j += 2) got[j] = run(*engine, jobs[j]);
      });
    for (auto& th : threads) th.join();
    for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(got[j], want[j]) << "job " << j << " round " << round;
  }
}

TEST(Concurrency, TwoThreadsOnTwoEnginesMatchOneAfterTheOther) {
  std::unique_ptr<Engine> engines[2] = {make_engine(2), make_engine(2)};
  const std::vector<Job> jobs = make_jobs(*engines[0]);
  std::vector<std::vector<std::vector<int32_t>>> want;
  for (const Job& job : jobs) want.push_back(run(*engines[0], job));
  std::vector<std::vector<std::vector<int32_t>>> got(jobs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (size_t j = t; j < jobs.size(); j += 2) got[j] = run(*engines[t], jobs[j]);
    });
  for (auto& th : threads) th.join();
  for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(got[j], want[j]) << "job " << j;
}

// Issue 42 item 8: set_matmul_precision while another thread generates on the same engine is refused,
// changing nothing (the running generation gets the tokens it gets alone); a live head_fn() counts as a
// generation; once none runs, it re-packs.
TEST(Concurrency, SetMatmulPrecisionIsRefusedWhileAGenerationRuns) {
  std::unique_ptr<Engine> engine = make_engine(2);
  const Job job = make_jobs(*engine)[0];
  const MatmulPrecision before = engine->matmul_precision();
  const MatmulPrecision other = before == MatmulPrecision::kF32 ? MatmulPrecision::kBF16 : MatmulPrecision::kF32;
  const std::vector<std::vector<int32_t>> want = run(*engine, job);
  std::promise<void> started, checked;
  std::shared_future<void> checked_future = checked.get_future().share();
  std::vector<std::vector<int32_t>> got;
  std::thread generating([&] {
    GenerateHooks hooks;
    hooks.on_step = [&, first = true](const StepInfo&) mutable {
      if (first) started.set_value(), checked_future.wait(), first = false;  // mid-generation until checked
      return true;
    };
    auto out = engine->generate(job.prompts, job.params, hooks);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (out.ok()) got = out->sequences;
  });
  started.get_future().wait();
  const Status refused = engine->set_matmul_precision(other);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("a generation is running"), std::string::npos) << refused.to_string();
  EXPECT_EQ(engine->matmul_precision(), before);
  checked.set_value();
  generating.join();
  EXPECT_EQ(got, want) << "the generation ran at its own precision throughout";

  HeadFn head = engine->head_fn();  // a scheduler's function: a generation while it lives
  EXPECT_FALSE(engine->set_matmul_precision(other).ok());
  head = nullptr;
  ASSERT_TRUE(engine->set_matmul_precision(other).ok());
  EXPECT_EQ(engine->matmul_precision(), other);
  ASSERT_TRUE(engine->set_matmul_precision(before).ok());
  EXPECT_EQ(run(*engine, job).size(), want.size());
}

// Both at once, unsynchronised: generations on one thread, precision changes on another. Each change is
// either done or refused with the message; every generation succeeds. Under ThreadSanitizer (scripts/
// test.sh --tsan) a data race between the re-pack and a forward fails the run.
TEST(Concurrency, SetMatmulPrecisionAndGenerateFromTwoThreads) {
  std::unique_ptr<Engine> engine = make_engine(2);
  Job job = make_jobs(*engine)[0];
  job.params.max_new_tokens = 8, job.params.steps = 4;
  std::thread generating([&] {
    for (int i = 0; i < 4; ++i) EXPECT_FALSE(run(*engine, job).empty()) << "generation " << i;
  });
  for (int i = 0; i < 40; ++i) {
    const Status s = engine->set_matmul_precision(i % 2 == 0 ? MatmulPrecision::kBF16 : MatmulPrecision::kF32);
    if (!s.ok()) {
      EXPECT_NE(s.message().find("a generation is running"), std::string::npos) << s.to_string();
    }
  }
  generating.join();
  EXPECT_TRUE(engine->set_matmul_precision(MatmulPrecision::kF32).ok()) << "nothing runs any more";
}

}  // namespace
}  // namespace dc
