// The server's batching on a device (issue 35 item 5; device 0: lavapipe in CI): concurrent jobs on
// `serve --device vulkan`'s scheduler — the jobs without a KV cache in one forward per step, those with a cache
// (dual, --fast's dual + threshold) in one forward of parts per step, each part over its own cache
// (Engine::parts_head_fn) — give the tokens each gives alone on the device and on the CPU (f32; the sampling on
// the device); a merged step of jobs with their own sampling settings is one submission; the memory budget
// weighs the device's memory (the KV cache counted); serve's per-request LoRA adapters on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fixtures.h"
#include "model/synthetic.h"
#include "random_adapter.h"
#include "server/scheduler_gate.h"
#include "temp_dir.h"
#include "vulkan_test_config.h"

namespace dc::server {
namespace {

// 4 prompts of different lengths × {no cache, dual cache in blocks of 4, --fast's mode (dual, threshold 0.9)},
// greedy with top-k and top-p (the filters run on the device), 8 new tokens in 8 steps; the algorithms origin,
// maskgit_plus, entropy, maskgit_plus. The device's entropies are within 2e-5 of the CPU's (its exp and
// summation order), and on this random model's near-uniform rows two positions' entropies are often closer
// than that, so the entropy cases are compared with the device alone only (the CPU comparison of entropy is
// test_model_vulkan's, on margin-screened reference cases).
std::vector<std::pair<std::vector<int32_t>, SamplingParams>> device_cases(const Engine& e) {
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> cases;
  for (const int mode : {0, 1, 2})
    for (int i = 0; i < 4; ++i) {
      SamplingParams p = e.default_params();
      p.max_new_tokens = 8;
      p.steps = 8;
      p.alg = i == 0 ? Algorithm::kOrigin : i == 2 ? Algorithm::kEntropy : Algorithm::kMaskgitPlus;
      p.seed = static_cast<uint64_t>(i);
      p.temperature = 0;
      p.top_k = 20;
      p.top_p = 0.9f;
      if (mode > 0) p.cache = CacheMode::kDual, p.block_length = 4;
      if (mode == 2) p.threshold = 0.9f;
      std::vector<int32_t> prompt;
      for (int j = 0; j < 3 + 2 * i; ++j) prompt.push_back(static_cast<int32_t>((37 * j + 11 * i + 5) % 290 + 1));
      cases.emplace_back(std::move(prompt), p);
    }
  return cases;
}

std::unique_ptr<Engine> engine_on(Device device, uint64_t seed, ThreadPool* pool) {
  const ModelConfig c = dc::testing::vulkan_test_config(2, 1, 16, 80);
  auto engine = Engine::from_model(make_synthetic_model(c, seed, pool).value(), 2, DeviceSpec{device, 0});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return nullptr;
  EXPECT_TRUE((*engine)->set_matmul_precision(MatmulPrecision::kF32).ok());
  return std::move(engine).value();
}

TEST(SchedulerVulkan, ConcurrentJobsOnTheDeviceEqualEachAloneThereAndOnTheCpu) {
  ThreadPool pool(2);
  auto device = engine_on(Device::kVulkan, 21, &pool);
  auto cpu = engine_on(Device::kCpu, 21, &pool);
  ASSERT_NE(device, nullptr);
  ASSERT_NE(cpu, nullptr);
  Engine& e = *device;
  const auto cases = device_cases(e);
  std::mutex mu;
  std::vector<size_t> parts_per_forward;  // of the forwards of parts (the engine thread's)
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
  Scheduler scheduler(gate.fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr,
                      [&e] { return e.head_fn(); }, make_parts_fn);
  std::vector<std::shared_ptr<Job>> jobs;  // job 0 (no cache) holds the gate: the others join its batch
  for (const auto& [prompt, params] : cases) jobs.push_back(std::make_shared<Job>(prompt, params, std::vector<int32_t>{}, false));
  const std::vector<JobResult> results = run_gated(scheduler, gate, jobs);
  ASSERT_EQ(results.size(), cases.size());
  const std::vector<int64_t> rows = gate.rows();
  EXPECT_EQ(*std::max_element(rows.begin(), rows.end()), 4) << "the 4 uncached jobs never shared a forward";
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_FALSE(parts_per_forward.empty());
    EXPECT_EQ(*std::max_element(parts_per_forward.begin(), parts_per_forward.end()), 8u)
        << "the 8 cached jobs never shared a forward of parts";
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [prompt, params] = cases[i];
    ASSERT_TRUE(results[i].status.ok()) << "case " << i << ": " << results[i].status.to_string();
    const auto alone = e.generate({prompt}, params);
    const auto on_cpu = cpu->generate({prompt}, params);
    ASSERT_TRUE(alone.ok() && on_cpu.ok()) << alone.status().to_string() << " / " << on_cpu.status().to_string();
    const std::vector<int32_t> want(alone->sequences[0].end() - 8, alone->sequences[0].end());
    const std::vector<int32_t> cpu_want(on_cpu->sequences[0].end() - 8, on_cpu->sequences[0].end());
    ASSERT_EQ(results[i].generated.size(), 1u);
    EXPECT_EQ(results[i].generated[0], want) << "case " << i << ": concurrent against alone on the device";
    if (params.alg != Algorithm::kEntropy) {
      EXPECT_EQ(results[i].generated[0], cpu_want) << "case " << i << ": concurrent on the device against the CPU";
    }
  }
}

// Issue 35 item 5: cached jobs with different sampling settings (greedy and sampled, top-k / top-p, the three
// confidences, their own seeds) merged on the device step in ONE submission each step (their forward of parts,
// one lm_head over all their rows, each job's sampling with its own filters), and each gives the tokens it gives
// alone there.
TEST(SchedulerVulkan, AMergedStepIsOneSubmissionWithEachJobsOwnSettings) {
  ThreadPool pool(2);
  auto device = engine_on(Device::kVulkan, 23, &pool);
  ASSERT_NE(device, nullptr);
  Engine& e = *device;
  const DeviceBackend& backend = *e.backend();
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> cases;
  for (int i = 0; i < 3; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = 8;
    p.steps = 8;
    p.cache = CacheMode::kDual, p.block_length = 4;
    p.alg = i == 0 ? Algorithm::kMaskgitPlus : i == 1 ? Algorithm::kEntropy : Algorithm::kTopkMargin;
    p.temperature = i == 0 ? 0.0f : 0.6f + 0.3f * static_cast<float>(i);
    p.top_k = i == 0 ? 20 : 0;
    p.top_p = i == 1 ? 0.9f : 1.0f;
    p.seed = static_cast<uint64_t>(5 * i + 2);
    std::vector<int32_t> prompt;
    for (int j = 0; j < 4 + 3 * i; ++j) prompt.push_back(static_cast<int32_t>((41 * j + 7 * i + 3) % 290 + 1));
    cases.emplace_back(std::move(prompt), p);
  }
  std::mutex mu;
  std::condition_variable cv;
  bool open = false, entered = false;
  std::vector<std::pair<size_t, int64_t>> calls;  // per forward of parts: its parts, the device's submits before it
  const auto make_parts_fn = [&]() -> PartsHeadFn {
    return [&, inner = e.parts_head_fn()](std::span<const ForwardBatch> parts) {
      {
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait(lock, [&] { return open; });  // the first forward waits until every job is queued
        calls.emplace_back(parts.size(), backend.counters().submits);
      }
      return inner(parts);
    };
  };
  Scheduler scheduler(e.head_fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr,
                      [&e] { return e.head_fn(); }, make_parts_fn);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& [prompt, params] : cases) {
    jobs.push_back(std::make_shared<Job>(prompt, params, std::vector<int32_t>{}, false));
    ASSERT_EQ(scheduler.submit(jobs.back()), SubmitResult::kOk);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  std::vector<JobResult> results;
  for (const auto& j : jobs) results.push_back(wait_result(*j));
  scheduler.stop();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << "case " << i << ": " << results[i].status.to_string();
    const auto alone = e.generate({cases[i].first}, cases[i].second);
    ASSERT_TRUE(alone.ok()) << alone.status().to_string();
    const std::vector<int32_t> want(alone->sequences[0].end() - 8, alone->sequences[0].end());
    EXPECT_EQ(results[i].generated[0], want) << "case " << i << ": merged against alone on the device";
  }
  // From a merged step's forward to the next forward: that step's one submission (nothing else runs on the
  // device; a step where no job needs a forward runs nothing).
  int64_t merged_steps = 0, all_three = 0;
  for (size_t k = 0; k + 1 < calls.size(); ++k) {
    if (calls[k].first < 2) continue;
    ++merged_steps;
    all_three += calls[k].first == 3 ? 1 : 0;
    EXPECT_EQ(calls[k + 1].second - calls[k].second, 1) << "the merged step of forward " << k << " (" << calls[k].first << " jobs)";
  }
  EXPECT_GT(merged_steps, 2) << "the jobs rarely shared a step: nothing was tested";
  EXPECT_GT(all_three, 0) << "the three jobs never shared a step";
}

// The budget on a device weighs its memory: a job with a KV cache needs its cache's bytes more than the same
// job without, and one over max_memory_bytes is refused at submit (the server's 503) before any forward.
TEST(SchedulerVulkan, TheBudgetCountsTheDevicesKvCache) {
  ThreadPool pool(2);
  auto device = engine_on(Device::kVulkan, 3, &pool);
  ASSERT_NE(device, nullptr);
  Engine& e = *device;
  SamplingParams p = e.default_params();
  p.max_new_tokens = 64;
  p.steps = 8;
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  const HeadMemory head = e.head_memory();
  ASSERT_GT(head.kv_bytes_per_position, 0);
  const int64_t uncached = api::job_memory_bytes(p, 4, head);
  p.cache = CacheMode::kDual, p.block_length = 64;
  EXPECT_EQ(api::job_memory_bytes(p, 4, head) - uncached, e.kv_cache_bytes(1, 68));
  SchedulerOptions options;
  options.max_memory_bytes = uncached;  // the cached job needs more
  Scheduler scheduler(e.head_fn(), e.config().n_vocab, head, &e.pool(), options, nullptr, [&e] { return e.head_fn(); });
  auto job = std::make_shared<Job>(prompt, p, std::vector<int32_t>{}, false);
  EXPECT_EQ(scheduler.submit(job), SubmitResult::kOverMemory);
  EXPECT_GT(scheduler.memory_needed(*job), options.max_memory_bytes);
}

// serve --lora NAME=DIR --device vulkan: the named adapters are uploaded once at load (the device's weight bytes,
// which the budget's auto setting subtracts, count them) and the scheduler's per-adapter forwards (the batched
// jobs without a cache, the cached ones in a forward of parts) run there: each job gives the tokens of a CPU
// engine holding only its adapter unmerged (f32; greedy, maskgit_plus and topk_margin: the entropy's device
// rounding is compared with the device alone above).
TEST(SchedulerVulkan, PerRequestAdaptersOnTheDeviceEqualEachAloneOnTheCpu) {
  const dc::test::TempDir tmp("sched_lora_vulkan");
  const std::string model_dir = dc::testing::fixtures_dir() + "/tiny-gqa2";
  const auto load = [&](Device device, std::vector<NamedLora> named, const std::string& lora) {
    EngineOptions o;
    o.model_dir = model_dir, o.n_threads = 2, o.weight_cache = "off", o.matmul_precision = MatmulPrecision::kF32;
    o.device = DeviceSpec{device, 0}, o.lora_adapters = std::move(named), o.lora_dir = lora, o.lora_mode = LoraMode::kUnmerged;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::move(*e) : nullptr;
  };
  const auto plain = load(Device::kVulkan, {}, "");
  ASSERT_NE(plain, nullptr);
  const std::vector<NamedLora> named = {{"x", tmp.file("x")}, {"y", tmp.file("y")}};
  ASSERT_TRUE(dc::testing::write_random_adapter(named[0].dir, plain->config(), 4, (1u << kLoraTargets) - 1, 1, 0.3f).ok());
  ASSERT_TRUE(dc::testing::write_random_adapter(named[1].dir, plain->config(), 2, (1u << kLoraQ) | (1u << kLoraDown), 2, 0.4f).ok());
  const auto device = load(Device::kVulkan, named, "");
  ASSERT_NE(device, nullptr);
  Engine& e = *device;
  EXPECT_GT(e.backend()->weight_bytes(), plain->backend()->weight_bytes()) << "the adapters are not on the device";
  const char* names[] = {"", "x", "y", "x", "y", ""};
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> cases;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = e.default_params();
    p.max_new_tokens = 8, p.steps = 8, p.temperature = 0.0f, p.seed = static_cast<uint64_t>(i);
    p.alg = i % 2 == 0 ? Algorithm::kMaskgitPlus : Algorithm::kTopkMargin;
    if (i >= 3) p.cache = CacheMode::kDual, p.block_length = 4;  // x and y in forwards of parts, the base alone
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 2 * i; ++j) prompt.push_back(static_cast<int32_t>((31 * j + 13 * i) % 300 + 1));
    jobs.push_back(std::make_shared<Job>(prompt, p, std::vector<int32_t>{}, false, e.lora_adapter(names[i])));
    cases.emplace_back(std::move(prompt), p);
  }
  ASSERT_NE(e.lora_adapter("x"), nullptr);
  Gate gate(e.head_fn());
  Scheduler scheduler(gate.fn(), e.config().n_vocab, e.head_memory(), &e.pool(), SchedulerOptions{}, nullptr,
                      [&e] { return e.head_fn(); }, [&e] { return e.parts_head_fn(); });
  const std::vector<JobResult> results = run_gated(scheduler, gate, jobs);
  ASSERT_EQ(results.size(), cases.size());
  std::map<std::string, std::unique_ptr<Engine>> alone;  // a CPU engine per adapter holding it alone ("": none)
  for (const char* name : {"", "x", "y"})
    alone[name] = load(Device::kCpu, {}, *name == '\0' ? "" : named[*name == 'x' ? 0 : 1].dir);
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << "case " << i << ": " << results[i].status.to_string();
    ASSERT_NE(alone[names[i]], nullptr);
    const auto want = alone[names[i]]->generate({cases[i].first}, cases[i].second);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    EXPECT_EQ(results[i].generated, want->generated) << "case " << i << " (adapter '" << names[i] << "')";
  }
  const auto base = alone[""]->generate({cases[1].first}, cases[1].second);  // case 1 without its adapter x
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  EXPECT_NE(results[1].generated, base->generated) << "adapter x changed no token: nothing was tested";
}

}  // namespace
}  // namespace dc::server
