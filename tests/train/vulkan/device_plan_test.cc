// The device memory plan of a training run (train/device_training.h plan_device_training, check_device_plan) on
// device 0 (lavapipe in CI): it covers what an SFT step really holds on the device (the backend's count of its
// buffers), with and without gradient checkpointing, and under a small device (DC_VULKAN_MEMORY_MIB) a run that
// would not fit is refused before its first step, naming the sizes and the fix that makes it fit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "train/device_training.h"
#include "train/trainer.h"
#include "vulkan_test_config.h"

namespace dc::train {
namespace {

ModelConfig plan_config() { return testing::vulkan_test_config(4, 2, 16, 96); }

TrainOptions plan_options(bool recompute) {
  TrainOptions o;
  o.seq_len = 64, o.batch_size = 4, o.grad_accum = 1, o.steps = 1;
  o.lr.lr = 1e-3, o.lr.total_steps = 1;
  o.recompute = recompute;
  o.precision = MatmulPrecision::kF32;
  return o;
}

ModelParams plan_params(const ModelConfig& c) {
  ThreadPool pool(2);
  auto synthetic = make_synthetic_model(c, 21, &pool, nullptr);
  EXPECT_TRUE(synthetic.ok());
  return ModelParams::from_weights(c, (*synthetic)->weights()).value();
}

std::unique_ptr<Trainer> plan_trainer(const ModelConfig& c, const TrainOptions& o, const Context& ctx) {
  Dataset d;
  uint64_t state = 9;
  for (int64_t i = 0; i < 8; ++i) {
    TrainSequence s;
    for (int64_t j = 0; j < o.seq_len; ++j) s.tokens.push_back(static_cast<int32_t>(splitmix64_next(state) % 298));
    s.loss_mask.assign(o.seq_len, 1);
    d.sequences.push_back(std::move(s));
  }
  auto t = Trainer::create_with_params(o, ctx, c, plan_params(c), std::move(d));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// The plan Trainer makes for `o` (its micro-batch: batch_size × seq_len positions, every one a loss row at most).
DeviceTrainingPlan sft_plan(const ModelConfig& c, const TrainOptions& o) {
  const ModelParams params = plan_params(c);
  const auto model = Model::from_weights(c, params.weights(), nullptr);
  DeviceBatchShape batch;
  batch.positions = batch.loss_rows = o.batch_size * o.seq_len;
  batch.recompute = o.recompute;
  return plan_device_training(*model, /*optimizer=*/true, /*reference=*/false, batch);
}

// Sets DC_VULKAN_MEMORY_MIB for its lifetime.
class MemoryCap {
 public:
  explicit MemoryCap(const std::string& mib) { setenv("DC_VULKAN_MEMORY_MIB", mib.c_str(), 1); }
  ~MemoryCap() { unsetenv("DC_VULKAN_MEMORY_MIB"); }
};

TEST(DevicePlan, CoversWhatAStepHoldsOnTheDevice) {
  const ModelConfig c = plan_config();
  ThreadPool pool(2);
  for (const bool recompute : {false, true}) {
    auto backend = open_vulkan_backend(0);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    Context dev;
    dev.pool = &pool, dev.device = Device::kVulkan, dev.backend = backend->get();
    const TrainOptions o = plan_options(recompute);
    auto t = plan_trainer(c, o, dev);
    ASSERT_TRUE(t != nullptr);
    const int64_t before = (*backend)->counters().device_bytes;  // the backend's own (kernels' fixed scratch)
    auto s = t->step();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const int64_t held = (*backend)->counters().device_peak_bytes - before;
    const DeviceTrainingPlan plan = sft_plan(c, o);
    std::printf("  recompute %d: the step held at most %lld bytes, the plan %lld (activations %lld)\n", recompute,
                static_cast<long long>(held), static_cast<long long>(plan.total()), static_cast<long long>(plan.activations));
    EXPECT_LE(held, plan.total()) << "recompute " << recompute << ": the plan misses part of the device's need";
    EXPECT_GE(held, plan.total() * 7 / 10) << "recompute " << recompute << ": the plan is far above the need";
    t.reset();
  }
  EXPECT_LT(sft_plan(c, plan_options(true)).activations, sft_plan(c, plan_options(false)).activations);
}

// A device between the checkpointed run's plan and the full one's: the full run is refused at start, naming the
// sizes and --grad-checkpointing as the fix that fits; the checkpointed run trains there.
TEST(DevicePlan, RefusesARunThatDoesNotFitNamingTheFix) {
  const ModelConfig c = plan_config();
  const int64_t full = sft_plan(c, plan_options(false)).total(), checkpointed = sft_plan(c, plan_options(true)).total();
  ASSERT_LT(checkpointed, full);
  const MemoryCap cap(std::to_string(static_cast<double>(checkpointed + full) / 2 / (1 << 20)));
  ThreadPool pool(2);
  for (const bool recompute : {false, true}) {
    auto backend = open_vulkan_backend(0);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    ASSERT_LT((*backend)->memory_bytes(), full);
    Context dev;
    dev.pool = &pool, dev.device = Device::kVulkan, dev.backend = backend->get();
    auto t = plan_trainer(c, plan_options(recompute), dev);
    ASSERT_TRUE(t != nullptr);
    auto s = t->step();
    if (recompute) {
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      continue;
    }
    ASSERT_FALSE(s.ok());
    const std::string m = s.status().message();
    std::printf("  refused: %s\n", m.c_str());
    EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << m;
    for (const char* part : {"activations", "working buffers", "loss rows", "Adam moments", "--grad-checkpointing", "which fits",
                             "--batch-size", "--lora-r", "--device cpu"})
      EXPECT_NE(m.find(part), std::string::npos) << "the refusal does not say '" << part << "': " << m;
    EXPECT_EQ(t->steps_done(), 0);
  }
}

TEST(DevicePlan, ABadMemoryCapIsRefusedByName) {
  for (const char* bad : {"abc", "0", "-1", "1e12"}) {
    const MemoryCap cap(bad);
    auto backend = open_vulkan_backend(0);
    ASSERT_FALSE(backend.ok()) << bad;
    EXPECT_NE(backend.status().message().find("DC_VULKAN_MEMORY_MIB"), std::string::npos) << backend.status().message();
  }
}

}  // namespace
}  // namespace dc::train
