// The model's forward on the Vulkan backend (device 0: lavapipe in CI) against the CPU f32 forward, uncached
// and cached, and greedy generation on it against the PyTorch reference's tokens (which the CPU path matches
// too) and, in the cache modes, against the CPU's.
// Tolerance: max |Δ| ≤ 1e-4 of the largest |logit| per case (f32 on both sides; the device sums in
// another order and has its own exp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "batch_case.h"
#include "engine/device_head_sampler.h"
#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "model/kv_cache.h"
#include "model/synthetic.h"
#include "model/transformer.h"
#include "random_adapter.h"
#include "sampler/generate.h"
#include "temp_dir.h"
#include "vulkan_test_config.h"

namespace dc {
namespace {

constexpr double kTolerance = 1e-4;

// An engine over `model` on device 0, or a test failure.
std::unique_ptr<Engine> on_vulkan(std::unique_ptr<Model> model) {
  auto engine = Engine::from_model(std::move(model), 2, DeviceSpec{Device::kVulkan, 0});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// max |got − want| / max |want| (infinite when a value is NaN).
double relative_error(const std::vector<float>& want, const std::vector<float>& got) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  return max_diff / max_ref;
}

// Runs `batch` through the model on the CPU (the reference kernels: f32 throughout) and on the device; expects max |Δ| within
// kTolerance of the largest |logit|, and returns that ratio.
double compare(const Model& model, Engine& device_engine, const ForwardBatch& batch, const std::string& label) {
  const int64_t V = model.config().n_vocab;
  ThreadPool pool(2);
  Context cpu{Device::kCpu, &pool};
  cpu.reference_kernels = true;  // f32 activations for every weight kind (the fast q8 / q4 GEMMs quantize them)
  std::vector<float> want(batch.n_out * V), got(batch.n_out * V, NAN);
  EXPECT_TRUE(model.forward(cpu, batch, want.data()).ok());
  auto fn = device_engine.logits_fn();
  const Status s = fn(batch, got.data());
  EXPECT_TRUE(s.ok()) << label << ": " << s.to_string();
  const double rel = relative_error(want, got);
  std::printf("  [%s] max |Δ| / max |logit|: %.2e\n", label.c_str(), rel);
  EXPECT_LE(rel, kTolerance) << label;
  return rel;
}

// For each fixture checkpoint the device takes (head_dim >= 16), its engines on device 0 and on the CPU (exact
// f32), and its reference cases of one prompt and at most 8 steps (lavapipe is slow): fn(model, case,
// device, cpu), until fn returns false.
void for_each_short_case(
    const std::function<bool(const nlohmann::json&, const nlohmann::json&, Engine&, Engine&)>& fn) {
  const auto manifest = dc::testing::load_manifest();
  for (const auto& m : manifest["models"]) {
    if (m["head_dim"].get<int64_t>() < 16) continue;
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    EngineOptions options;
    options.model_dir = dir, options.n_threads = 2, options.device = DeviceSpec{Device::kVulkan, 0};
    auto device = Engine::load(options);
    auto cpu = dc::testing::load_exact(dir, 2);
    if (!device.ok() || !cpu.ok()) {
      ADD_FAILURE() << device.status().to_string() << " / " << cpu.status().to_string();
      return;
    }
    const auto gen = dc::testing::load_json(dir + "/reference/generate.json");
    for (const auto& c : gen["cases"]) {
      if (c["params"]["steps"].get<int>() > 8 || c["prompts"].size() != 1) continue;
      if (!fn(m, c, **device, **cpu)) return;
    }
  }
}

// Synthetic checkpoints over the head sizes the attention kernel takes (16..128), MHA and GQA, with bf16,
// q8 and q4 weights; a left-padded batch of 3 rows with explicit positions.
TEST(ForwardVulkan, SyntheticShapesMatchTheCpu) {
  struct Shape { int64_t n_head, n_head_kv, head_dim; const char* weights; };
  for (const Shape& s : {Shape{4, 4, 16, "bf16"}, Shape{4, 2, 32, "q8"}, Shape{2, 1, 64, "q4"}, Shape{2, 2, 128, "bf16"}}) {
    const ModelConfig c = testing::vulkan_test_config(s.n_head, s.n_head_kv, s.head_dim, 2 * s.n_head * s.head_dim + 32);
    QuantizeOptions quantize;
    quantize.format = std::string(s.weights) == "q8" ? WeightQuant::kQ8 : WeightQuant::kQ4;
    quantize.group_size = 32;
    ThreadPool pool(2);
    auto model = make_synthetic_model(c, 7, &pool, std::string(s.weights) == "bf16" ? nullptr : &quantize);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    auto cpu_model = make_synthetic_model(c, 7, &pool, std::string(s.weights) == "bf16" ? nullptr : &quantize);
    auto device = on_vulkan(std::move(*model));
    ASSERT_NE(device, nullptr);
    const BatchCase batch = left_padded(3, 21, c.n_vocab, static_cast<uint32_t>(s.head_dim));
    compare(**cpu_model, *device, batch.view(),
            "H " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " D " + std::to_string(s.head_dim) + " " + s.weights);
  }
}

// The fixture checkpoints whose heads the kernel takes (tiny-gqa2: head_dim 16, 6 / 3 heads, sharded
// f32) on every reference forward case (odd length, equal rows, left padding, explicit positions); the
// others (head_dim 4 and 8) are refused at load with an error naming head_dim.
TEST(ForwardVulkan, FixtureCheckpointsMatchTheCpuOrAreRefused) {
  const auto manifest = dc::testing::load_manifest();
  int n_cases = 0, n_refused = 0;
  for (const auto& m : manifest["models"]) {
    if (m["vocab_size"].get<int64_t>() > 1000) continue;  // tiny-vocab: the 152k lm_head, covered on the CPU
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    auto cpu_model = Model::load(dir);
    auto device_model = Model::load(dir);
    ASSERT_TRUE(cpu_model.ok() && device_model.ok());
    if ((*cpu_model)->config().head_dim < 16) {
      auto refused = Engine::from_model(std::move(*device_model), 1, DeviceSpec{Device::kVulkan, 0});
      ASSERT_FALSE(refused.ok()) << m["name"];
      EXPECT_NE(refused.status().message().find("head_dim"), std::string::npos) << refused.status().message();
      ++n_refused;
      continue;
    }
    auto device = on_vulkan(std::move(*device_model));
    ASSERT_NE(device, nullptr);
    const auto fwd = dc::testing::load_json(dir + "/reference/forward.json");
    for (const auto& c : fwd["cases"]) {
      const BatchCase k = forward_fixture_case(c);
      compare(**cpu_model, *device, k.view(), m["name"].get<std::string>() + "/" + c["name"].get<std::string>());
      ++n_cases;
    }
  }
  EXPECT_GE(n_cases, 5);
  EXPECT_GE(n_refused, 2);
}

// Greedy generation on the device gives the reference's tokens on the margin-screened cases of tiny-gqa2
// with at most 8 steps (origin, maskgit_plus, topk_margin, entropy; batch 1 and left-padded 3; top-p /
// top-k: 7 cases, ~30 forwards — lavapipe is slow), as the CPU does on all of them
// (tests/engine/generate_parity_test.cc), in the uncached mode.
TEST(ForwardVulkan, GreedyGenerationIsTokenIdenticalOnEveryAlgorithm) {
  const auto manifest = dc::testing::load_manifest();
  int n_cases = 0;
  std::set<std::string> algorithms;
  for (const auto& m : manifest["models"]) {
    if (m["head_dim"].get<int64_t>() < 16) continue;
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    EngineOptions options;
    options.model_dir = dir, options.n_threads = 2, options.device = DeviceSpec{Device::kVulkan, 0};
    auto engine = Engine::load(options);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    const auto gen = dc::testing::load_json(dir + "/reference/generate.json");
    for (const auto& c : gen["cases"]) {
      const auto& p = c["params"];
      if (p["steps"].get<int>() > 8) continue;
      const SamplingParams s = dc::testing::reference_params(**engine, p);
      auto out = (*engine)->generate(c["prompts"].get<std::vector<std::vector<int32_t>>>(), s);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(out->sequences, c["sequences"].get<std::vector<std::vector<int32_t>>>()) << m["name"] << "/" << c["name"];
      algorithms.insert(p["alg"].get<std::string>());
      ++n_cases;
    }
  }
  EXPECT_GE(n_cases, 7);
  EXPECT_EQ(algorithms.size(), 4u);
}

// A LoRA adapter merged at load (the default --lora mode) runs on the device: the merged weights are what is
// uploaded, so the device's logits equal the CPU's merged model's within kTolerance and differ from the
// base's.
TEST(ForwardVulkan, MergedLoraAdapterMatchesTheCpu) {
  const std::string dir = dc::testing::fixtures_dir() + "/tiny-gqa2";
  auto base = Model::load(dir);
  ASSERT_TRUE(base.ok()) << base.status().to_string();
  const test::TempDir tmp("vulkan_lora");
  const std::string adapter = tmp.file("adapter");
  ASSERT_TRUE(dc::testing::write_random_adapter(adapter, (*base)->config(), 4, (1u << kLoraTargets) - 1, 7, 0.05f).ok());
  EngineOptions options;
  options.model_dir = dir, options.n_threads = 2, options.lora_dir = adapter;
  options.device = DeviceSpec{Device::kVulkan, 0};
  auto device = Engine::load(options);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  options.device = DeviceSpec{};
  auto cpu = Engine::load(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  const BatchCase batch = left_padded(3, 12, (*base)->config().n_vocab, 11);
  compare((*cpu)->model(), **device, batch.view(), "tiny-gqa2 + merged LoRA");
  // The adapter changed the model the device runs.
  ThreadPool pool(2);
  Context ctx{Device::kCpu, &pool};
  ctx.reference_kernels = true;
  const int64_t n = batch.view().n_out * (*base)->config().n_vocab;
  std::vector<float> plain(n), merged(n);
  ASSERT_TRUE((*base)->forward(ctx, batch.view(), plain.data()).ok());
  ASSERT_TRUE((*cpu)->model().forward(ctx, batch.view(), merged.data()).ok());
  EXPECT_GT(relative_error(plain, merged), 1e-3) << "the adapter changed nothing";
}

// --lora-mode unmerged on the device (f32): the adapter is uploaded once at load (the device's weight bytes grow by
// its f32 values) and every forward adds it there, so the logits equal the CPU's unmerged engine's within
// kTolerance, and greedy generations (no cache, dual cache) give the CPU's unmerged tokens and the device's merged
// model's.
TEST(ForwardVulkan, UnmergedLoraAdapterMatchesTheCpuAndTheMerged) {
  const std::string dir = dc::testing::fixtures_dir() + "/tiny-gqa2";
  const test::TempDir tmp("vulkan_unmerged");
  const std::string adapter = tmp.file("adapter");
  {
    auto base = Model::load(dir);
    ASSERT_TRUE(base.ok()) << base.status().to_string();
    ASSERT_TRUE(dc::testing::write_random_adapter(adapter, (*base)->config(), 4, (1u << kLoraTargets) - 1, 7, 0.05f).ok());
  }
  const auto load = [&](Device device, LoraMode mode, const std::string& lora) {
    EngineOptions options;
    options.model_dir = dir, options.n_threads = 2, options.weight_cache = "off";
    options.matmul_precision = MatmulPrecision::kF32;
    options.lora_dir = lora, options.lora_mode = mode, options.device = DeviceSpec{device, 0};
    auto engine = Engine::load(options);
    EXPECT_TRUE(engine.ok()) << engine.status().to_string();
    return engine.ok() ? std::move(engine).value() : nullptr;
  };
  const auto device = load(Device::kVulkan, LoraMode::kUnmerged, adapter);
  const auto cpu = load(Device::kCpu, LoraMode::kUnmerged, adapter);
  const auto merged = load(Device::kVulkan, LoraMode::kMerged, adapter);
  const auto base = load(Device::kVulkan, LoraMode::kMerged, "");
  ASSERT_TRUE(device && cpu && merged && base);
  EXPECT_NE(device->lora_note().find("unmerged"), std::string::npos) << device->lora_note();
  ASSERT_NE(device->model().lora(), nullptr);
  LoraSpec spec;  // write_random_adapter's
  spec.r = 4, spec.targets = (1u << kLoraTargets) - 1;
  const int64_t adapter_bytes = LoraParams::zeros(device->config(), spec).n_values() * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(device->backend()->weight_bytes() - base->backend()->weight_bytes(), adapter_bytes)
      << "the adapter is uploaded at load, once";
  const BatchCase batch = left_padded(3, 12, device->config().n_vocab, 11);
  compare(cpu->model(), *device, batch.view(), "tiny-gqa2 + unmerged LoRA");
  for (const CacheMode cache : {CacheMode::kNone, CacheMode::kDual}) {
    SamplingParams p = device->default_params();
    p.max_new_tokens = 8, p.steps = 8, p.temperature = 0.0f, p.cache = cache;
    if (cache != CacheMode::kNone) p.block_length = 4;
    const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7}};
    auto got = device->generate(prompts, p);
    auto want = cpu->generate(prompts, p);
    auto as_merged = merged->generate(prompts, p);
    auto plain = base->generate(prompts, p);
    ASSERT_TRUE(got.ok() && want.ok() && as_merged.ok() && plain.ok()) << got.status().to_string();
    const int c = static_cast<int>(cache);
    EXPECT_EQ(got->generated, want->generated) << "cache " << c << ": device unmerged against the CPU's";
    EXPECT_EQ(got->generated, as_merged->generated) << "cache " << c << ": unmerged against merged on the device";
    EXPECT_NE(got->generated, plain->generated) << "cache " << c << ": the adapter changed no token";
  }
}

// The cached forward (spec §6) on the device against the CPU's on the same cache ops: a refresh, then two
// windows with new tokens in them (the prefix mode's [5, L) and the dual mode's [5, 14)), each reading the
// cache the previous forward left. Synthetic MHA / GQA checkpoints, a left-padded batch of 3; within
// kTolerance of the largest logit, as the uncached forward.
TEST(ForwardVulkan, CachedForwardMatchesTheCpu) {
  struct Shape { int64_t n_head, n_head_kv, head_dim; };
  for (const Shape& s : {Shape{4, 2, 32}, Shape{2, 1, 64}}) {
    const ModelConfig c = testing::vulkan_test_config(s.n_head, s.n_head_kv, s.head_dim, 2 * s.n_head * s.head_dim + 32);
    ThreadPool pool(2);
    auto cpu_model = make_synthetic_model(c, 11, &pool).value();
    auto device = on_vulkan(make_synthetic_model(c, 11, &pool).value());
    ASSERT_NE(device, nullptr);
    Context cpu{Device::kCpu, &pool};
    cpu.reference_kernels = true;
    KvCache cpu_cache;
    auto device_fn = device->logits_fn();  // one generation: its cache persists across the calls
    BatchCase k = left_padded(3, 21, c.n_vocab, static_cast<uint32_t>(s.head_dim));
    struct Step { CacheOp op; int64_t begin, end; };
    for (const Step step : {Step{CacheOp::kRefresh, 0, 21}, Step{CacheOp::kUse, 5, 21}, Step{CacheOp::kUse, 5, 14}}) {
      const std::string label = "H " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + " D " +
                                std::to_string(s.head_dim) + " window [" + std::to_string(step.begin) + ", " + std::to_string(step.end) + ")";
      if (step.op == CacheOp::kUse)  // new tokens in the window; the rows asked for: the window's real positions
        for (int64_t r = 0; r < k.B; ++r)
          for (int64_t i = step.begin; i < step.end; ++i) k.tokens[r * k.L + i] = static_cast<int32_t>((k.tokens[r * k.L + i] * 7 + i) % 298);
      k.rows = window_rows(k, step.begin, step.end);
      ForwardBatch b = k.view(k.rows, step.op, nullptr, step.begin, step.end);
      std::vector<float> want(b.n_out * c.n_vocab), got(b.n_out * c.n_vocab, NAN);
      b.cache = &cpu_cache;
      ASSERT_TRUE(cpu_model->forward(cpu, b, want.data()).ok()) << label;
      b.cache = nullptr;  // the device generation's own
      const Status st = device_fn(b, got.data());
      ASSERT_TRUE(st.ok()) << label << ": " << st.to_string();
      const double rel = relative_error(want, got);
      std::printf("  [%s] max |Δ| / max |logit|: %.2e\n", label.c_str(), rel);
      EXPECT_LE(rel, kTolerance) << label;
    }
  }
}

// Greedy generation in each cache mode (prefix, dual) is token-identical on the device and on the CPU (f32),
// for every algorithm: the first one-row case among the margin-screened tiny-gqa2 cases of the uncached
// test with each algorithm, in two blocks of at least 2 steps each (the origin case's single step raised
// to 4), so that every block has a refresh and window forwards (8 generations of one row: lavapipe is
// slow, a batch of 3 costs 3x; left padding under the cache is CachedForwardMatchesTheCpu's).
TEST(ForwardVulkan, CachedGenerationIsTokenIdenticalToTheCpu) {
  std::set<std::string> covered;  // "alg mode"
  for_each_short_case([&](const nlohmann::json& m, const nlohmann::json& c, Engine& device, Engine& cpu) {
    const auto& p = c["params"];
    const auto prompts = c["prompts"].get<std::vector<std::vector<int32_t>>>();
    for (const CacheMode mode : {CacheMode::kPrefix, CacheMode::kDual}) {
      const std::string what = p["alg"].get<std::string>() + (mode == CacheMode::kDual ? " dual" : " prefix");
      if (!covered.insert(what).second) continue;
      SamplingParams s = dc::testing::reference_params(device, p);
      s.cache = mode;
      s.block_length = s.max_new_tokens.value() / 2;
      s.steps = std::max(s.steps, 4);
      auto want = cpu.generate(prompts, s);
      auto got = device.generate(prompts, s);
      EXPECT_TRUE(want.ok() && got.ok()) << want.status().to_string() << " / " << got.status().to_string();
      if (!want.ok() || !got.ok()) return false;
      EXPECT_EQ(got->sequences, want->sequences) << m["name"] << "/" << c["name"] << ": " << what;
      std::printf("  [%s/%s: %s] %zu rows, %d steps, blocks of %lld\n", m["name"].get<std::string>().c_str(),
                  c["name"].get<std::string>().c_str(), what.c_str(), prompts.size(), s.steps, static_cast<long long>(s.block_length));
    }
    return true;
  });
  EXPECT_EQ(covered.size(), 8u);  // 4 algorithms × 2 modes
}

// Forwards of one shape are recorded once and replayed: three batches of one shape with other tokens each
// match the CPU, and the second and third record nothing. In a generation the body (the layers over the
// canvas, one shape per generation) replays too, and only the per-step rows (the out rows, the head's
// masked rows) record: 4 steps record fewer dispatches than 2 whole forwards have (without replay: 4).
TEST(ForwardVulkan, StepsOfOneShapeRecordOnce) {
  ModelConfig c = synthetic_config("tiny").value();
  c.n_head = 4, c.n_head_kv = 2, c.head_dim = 32, c.n_embd = 128, c.n_ff = 288, c.n_vocab = 300;
  c.mask_token_id = 298, c.pad_token_id = c.eos_token_id = c.bos_token_id = 299;
  ThreadPool pool(2);
  auto cpu_model = make_synthetic_model(c, 5, &pool);
  auto device = on_vulkan(make_synthetic_model(c, 5, &pool).value());
  ASSERT_TRUE(device != nullptr && cpu_model.ok());
  const DeviceBackend& backend = *device->backend();
  const DeviceCounters start = backend.counters();
  compare(**cpu_model, *device, left_padded(3, 21, c.n_vocab, 1).view(), "recorded");
  const DeviceCounters first = backend.counters();
  const int64_t forward_dispatches = first.dispatches_recorded - start.dispatches_recorded;
  for (uint32_t seed = 2; seed <= 3; ++seed)
    compare(**cpu_model, *device, left_padded(3, 21, c.n_vocab, seed).view(), "replayed " + std::to_string(seed));
  const DeviceCounters now = backend.counters();
  EXPECT_EQ(now.runs - first.runs, 2);
  EXPECT_EQ(now.recordings, first.recordings);
  EXPECT_EQ(now.descriptor_sets, first.descriptor_sets);
  // Replayed or recorded, every run's dispatches count as run, and collecting them took host time.
  EXPECT_EQ(first.dispatches_run - start.dispatches_run, forward_dispatches);
  EXPECT_EQ(now.dispatches_run - first.dispatches_run, 2 * forward_dispatches);
  EXPECT_GT(now.collect_ms, first.collect_ms);

  SamplingParams p = device->default_params();
  p.steps = 4, p.max_new_tokens = 8, p.alg = Algorithm::kEntropy;
  auto out = device->generate({{5, 6, 7, 8}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const int64_t generation = backend.counters().dispatches_recorded - now.dispatches_recorded;
  std::printf("  a forward: %lld dispatches; a generation of 4 steps recorded %lld\n", static_cast<long long>(forward_dispatches),
              static_cast<long long>(generation));
  EXPECT_LT(generation, 2 * forward_dispatches);
}

// Sampled generation (temperature, top-k, top-p: the whole step on the device, the draws the CPU's streams)
// token-identical to the CPU's for every algorithm, uncached, on one tiny checkpoint's single-prompt cases of
// at most 8 steps. Margin-screened: a case (seed) is used only when the CPU's tokens survive nudging every
// logit by ±1e-5 of its row's largest |logit| (20x the device's error), so no draw or top-p cut lies within
// the device's rounding of a boundary; up to 3 seeds are tried per algorithm.
TEST(ForwardVulkan, SampledGenerationIsTokenIdenticalToTheCpu) {
  const FilterConfig filters[4] = {{0.7f, 0.9f, 0}, {1.0f, 1.0f, 20}, {0.5f, 0.95f, 10}, {0.9f, 0.8f, 0}};
  std::set<std::string> covered;
  for_each_short_case([&](const nlohmann::json& m, const nlohmann::json& c, Engine& device, Engine& cpu) {
    const auto& p = c["params"];
    const auto prompts = c["prompts"].get<std::vector<std::vector<int32_t>>>();
    const std::string alg = p["alg"].get<std::string>();
    if (covered.count(alg) != 0) return true;
    SamplingParams s = dc::testing::reference_params(device, p);
    const FilterConfig& f = filters[covered.size()];
    s.temperature = f.temperature, s.top_p = f.top_p, s.top_k = f.top_k;
    for (uint64_t seed = 11; seed < 14 && covered.count(alg) == 0; ++seed) {
      s.seed = seed;
      auto want = cpu.generate(prompts, s);
      EXPECT_TRUE(want.ok()) << want.status().to_string();
      if (!want.ok()) return false;
      bool screened = true;
      for (float sign : {1.0f, -1.0f}) {
        GenerateHooks nudged;
        nudged.logits_hook = [sign](const LogitsHookArgs& a) {
          for (int64_t r = 0; r * a.n_vocab < static_cast<int64_t>(a.logits.size()); ++r) {
            float* row = a.logits.data() + r * a.n_vocab;
            float top = 0.0f;
            for (int64_t i = 0; i < a.n_vocab; ++i) top = std::max(top, std::abs(row[i]));
            for (int64_t i = 0; i < a.n_vocab; ++i) row[i] += sign * 1e-5f * top * ((i * 7 + r) % 3 == 0 ? 1.0f : -1.0f);
          }
        };
        auto near = cpu.generate(prompts, s, nudged);
        screened = screened && near.ok() && near->sequences == want->sequences;
      }
      if (!screened) continue;
      auto got = device.generate(prompts, s);
      EXPECT_TRUE(got.ok()) << got.status().to_string();
      if (!got.ok()) return false;
      EXPECT_EQ(got->sequences, want->sequences) << m["name"] << "/" << c["name"] << ": " << alg << " seed " << seed;
      covered.insert(alg);
      std::printf("  [%s/%s: %s] T %.1f top_p %.2f top_k %lld, seed %llu, %d steps\n", m["name"].get<std::string>().c_str(),
                  c["name"].get<std::string>().c_str(), alg.c_str(), f.temperature, f.top_p, static_cast<long long>(f.top_k),
                  static_cast<unsigned long long>(seed), s.steps);
    }
    return covered.size() < 4u;  // one checkpoint is enough: lavapipe is slow
  });
  EXPECT_EQ(covered.size(), 4u);
}

// The server weighs what the device path holds per out row: on the host the few numbers of a position that
// every step (greedy or sampled, filtered or not) sends and downloads, on the device its hidden row and its
// logits row — nothing fixed (the CPU's head holds a hidden row per out row and one chunk of logits) — and per
// canvas position the forward's activations and the KV cache's K and V (the CPU's budget counts neither).
TEST(ForwardVulkan, HeadMemoryCountsWhatADeviceStepHolds) {
  ModelConfig c = synthetic_config("tiny").value();
  ThreadPool pool(2);
  auto device = on_vulkan(make_synthetic_model(c, 3, &pool).value());
  ASSERT_NE(device, nullptr);
  const HeadMemory m = device->head_memory();
  EXPECT_EQ(m.bytes_per_row, DeviceHeadSampler::kHostBytesPerPosition + kSamplerBytesPerPosition + (c.n_embd + c.n_vocab) * 4);
  EXPECT_EQ(m.fixed_bytes, 0);
  EXPECT_EQ(m.kv_bytes_per_position, 2 * c.n_layer * c.n_head_kv * c.head_dim * 4);
  EXPECT_GE(m.bytes_per_position, (2 * c.n_embd + 2 * c.n_head * c.head_dim + 2 * c.n_ff) * 4);
  const auto cpu = Engine::from_model(make_synthetic_model(c, 3, &pool).value(), 1);
  EXPECT_GT(cpu->head_memory().fixed_bytes, 0);
  EXPECT_EQ(cpu->head_memory().bytes_per_position, 0);
  EXPECT_EQ(cpu->head_memory().kv_bytes_per_position, 0);
}

// Without a driver (VK_ICD_FILENAMES / VK_DRIVER_FILES pointing nowhere) --device vulkan fails at load
// with kNotFound saying what to install.
TEST(ForwardVulkan, AbsentDriverIsAClearError) {
  const char* names[2] = {"VK_ICD_FILENAMES", "VK_DRIVER_FILES"};
  std::vector<std::string> saved;
  for (const char* n : names) saved.push_back(std::getenv(n) != nullptr ? std::getenv(n) : "\x01");
  for (const char* n : names) setenv(n, "/nonexistent", 1);
  ThreadPool pool(1);
  auto engine = Engine::from_model(make_synthetic_model(synthetic_config("tiny").value(), 3, &pool).value(), 1,
                                   DeviceSpec{Device::kVulkan, 0});
  for (int i = 0; i < 2; ++i) {
    if (saved[i] == "\x01") unsetenv(names[i]);
    else setenv(names[i], saved[i].c_str(), 1);
  }
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kNotFound);
  EXPECT_NE(engine.status().message().find("mesa-vulkan-drivers"), std::string::npos) << engine.status().message();
}

}  // namespace
}  // namespace dc
