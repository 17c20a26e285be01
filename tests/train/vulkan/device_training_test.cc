// DeviceTraining's optimizer step (train/device_training.h) on device 0 (lavapipe in CI) against
// OptimizerCore::step on the CPU over the same gradients: the global norm, clip_grad_norm's coefficient with
// clipping active and inactive (seen in the moments, which are linear in it), the updated weights, and the
// skip of a non-finite gradient norm, all decided on the device (the norm comes back as a metric only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
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
#include "train/optimizer_core.h"
#include "vulkan_test_config.h"

namespace dc::train {
namespace {

ModelParams synthetic_params(const ModelConfig& c) {
  ThreadPool pool(2);
  auto synthetic = make_synthetic_model(c, 21, &pool, nullptr);
  EXPECT_TRUE(synthetic.ok());
  auto params = ModelParams::from_weights(c, (*synthetic)->weights());
  EXPECT_TRUE(params.ok());
  return std::move(params).value();
}

// Gradients in [-0.05, 0.05): a norm of about 3 over the tiny shape's ~100 K values.
void fill_gradients(ModelParams& g, uint64_t seed) {
  uint64_t state = seed;
  for (int64_t i = 0; i < g.n_values(); ++i)
    g.data()[i] = (static_cast<float>(splitmix64_next(state) >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
}

OptimizerOptions step_options(double max_grad_norm) {
  OptimizerOptions o;
  o.lr.schedule = LrSchedule::kConstant, o.lr.lr = 1e-3, o.lr.total_steps = 4;
  o.adam.eps = 1e-3, o.adam.weight_decay = 0.1;  // eps 1e-3: the update moves with the clipped gradient's size
  o.max_grad_norm = max_grad_norm;
  return o;
}

// max |got − want| ≤ rel · max |want| over every value.
void expect_close_params(const ModelParams& got, const ModelParams& want, double rel, const std::string& what) {
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < want.n_values(); ++i) {
    largest = std::max(largest, std::abs(static_cast<double>(want.data()[i])));
    const double d = std::abs(static_cast<double>(got.data()[i]) - want.data()[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  EXPECT_LE(worst, rel * largest) << what << ": max |Δ| " << worst << " against max |value| " << largest;
}

// One trainer's optimizer on a device of its own (DeviceTraining keeps its weights' copies in the backend):
// its core (the host's copy of the state) and DeviceTraining. Members in destruction order's reverse.
struct OnDevice {
  std::unique_ptr<DeviceBackend> backend;
  Context ctx;
  OptimizerCore core;
  std::unique_ptr<Model> model;
  std::unique_ptr<DeviceTraining> device;
};

std::unique_ptr<OnDevice> start_on_device(const ModelConfig& c, const OptimizerOptions& o, ThreadPool& pool) {
  auto d = std::make_unique<OnDevice>();
  auto backend = open_vulkan_backend(0);
  EXPECT_TRUE(backend.ok()) << backend.status().to_string();
  if (!backend.ok()) return nullptr;
  d->backend = std::move(backend).value();
  d->ctx.pool = &pool, d->ctx.device = Device::kVulkan, d->ctx.backend = d->backend.get();
  d->core = OptimizerCore::start(c, synthetic_params(c), o);
  d->model = Model::from_weights(c, d->core.params().weights(), nullptr);
  auto device = DeviceTraining::start(d->ctx, *d->model, &d->core, DeviceBatchShape{});
  EXPECT_TRUE(device.ok()) << device.status().to_string();
  if (!device.ok()) return nullptr;
  d->device = std::move(device).value();
  return d;
}

// Clipping active (max_norm 0.5 against a norm of ~3) and inactive (1e3, and 0: off): the norm within 1e-5
// relative, the moments (m = (1 − β1)·c·g at the first step: the coefficient c itself) and the weights.
TEST(DeviceOptimizerStep, ClipsAsTheCpuDoesActiveAndInactive) {
  ThreadPool pool(2);
  Context cpu_ctx;
  cpu_ctx.pool = &pool;
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  for (const double max_norm : {0.5, 1e3, 0.0}) {
    const std::string what = "max_grad_norm " + std::to_string(max_norm);
    OptimizerCore cpu = OptimizerCore::start(c, synthetic_params(c), step_options(max_norm));
    fill_gradients(cpu.grads(), 3);
    const std::unique_ptr<OnDevice> dev = start_on_device(c, step_options(max_norm), pool);
    ASSERT_TRUE(dev != nullptr);
    ASSERT_TRUE(dev->device->grads().upload(dev->ctx, cpu.grads()).ok());
    const OptimizerStepStats want = cpu.step(cpu_ctx, nullptr, 1.0);
    auto got = dev->device->step(dev->ctx, dev->core, 1.0);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_FALSE(got->skipped) << what;
    EXPECT_NEAR(got->grad_norm, want.grad_norm, 1e-5 * want.grad_norm) << what;
    EXPECT_EQ(got->lr, want.lr);
    EXPECT_EQ(dev->core.steps_done(), 1);
    const float coefficient = clip_coefficient(want.grad_norm, max_norm);
    if (max_norm == 0.5) EXPECT_LT(coefficient, 0.2f) << "the test wants clipping on";
    else EXPECT_EQ(coefficient, 1.0f) << "the test wants clipping off";
    ASSERT_TRUE(dev->device->sync_to_host(dev->ctx, dev->core).ok());
    expect_close_params(dev->core.m(), cpu.m(), 1e-5, "m, " + what);
    expect_close_params(dev->core.v(), cpu.v(), 2e-5, "v, " + what);  // (c·g)²: twice m's relative error
    // The weights: the update relative to its own size (the weights themselves are ~100x larger).
    ModelParams want_step = synthetic_params(c), got_step = synthetic_params(c);
    for (int64_t i = 0; i < want_step.n_values(); ++i)
      want_step.data()[i] = cpu.params().data()[i] - want_step.data()[i],
      got_step.data()[i] = dev->core.params().data()[i] - got_step.data()[i];
    expect_close_params(got_step, want_step, 1e-4, "the weights' update, " + what);
  }
}

// A NaN gradient: the device skips the update by itself (the weights and moments stay bit for bit), says so
// as the CPU does, and the next finite step applies again. A non-finite loss skips before the device is asked.
TEST(DeviceOptimizerStep, SkipsANonFiniteNormOnTheDevice) {
  ThreadPool pool(2);
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  const std::unique_ptr<OnDevice> dev = start_on_device(c, step_options(0.5), pool);
  ASSERT_TRUE(dev != nullptr);
  ModelParams g = ModelParams::zeros(c);
  fill_gradients(g, 4);
  ASSERT_TRUE(dev->device->grads().upload(dev->ctx, g).ok());
  ASSERT_TRUE(dev->device->step(dev->ctx, dev->core, 1.0).ok());  // a first applied step: moments not zero
  ASSERT_TRUE(dev->device->sync_to_host(dev->ctx, dev->core).ok());
  const std::vector<float> p1(dev->core.params().data(), dev->core.params().data() + g.n_values());
  const std::vector<float> m1(dev->core.m().data(), dev->core.m().data() + g.n_values());
  for (const bool nan_gradient : {true, false}) {
    g.data()[g.n_values() / 2] = nan_gradient ? std::numeric_limits<float>::quiet_NaN() : 0.01f;
    ASSERT_TRUE(dev->device->grads().upload(dev->ctx, g).ok());
    auto s = dev->device->step(dev->ctx, dev->core, nan_gradient ? 1.0 : std::numeric_limits<double>::infinity());
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_TRUE(s->skipped);
    EXPECT_EQ(s->skip_cause, nan_gradient ? "the gradient norm is nan" : "the loss is inf");
    ASSERT_TRUE(dev->device->sync_to_host(dev->ctx, dev->core).ok());
    EXPECT_TRUE(std::equal(p1.begin(), p1.end(), dev->core.params().data())) << "the weights moved on a skipped step";
    EXPECT_TRUE(std::equal(m1.begin(), m1.end(), dev->core.m().data())) << "the moments moved on a skipped step";
  }
  auto s = dev->device->step(dev->ctx, dev->core, 1.0);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_FALSE(s->skipped);
  EXPECT_EQ(dev->core.steps_done(), 4);
  ASSERT_TRUE(dev->device->sync_to_host(dev->ctx, dev->core).ok());
  EXPECT_NE(p1[0], dev->core.params().data()[0]) << "a finite step after the skips applies";
}

// A trainer's weights on the device are its own, found by tensor index: a trainer over host buffers whose
// addresses hold an older copy (as a new trainer meets addresses the allocator handed out again) starts from
// their values, and so does a second trainer after a first one updated its copies, which go with it.
TEST(DeviceTrainingWeights, StartsFromItsHostValuesNotAStaleCopy) {
  ThreadPool pool(2);
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  Context dev;
  dev.pool = &pool, dev.device = Device::kVulkan, dev.backend = backend->get();
  OptimizerCore core = OptimizerCore::start(c, synthetic_params(c), step_options(0.5));
  const auto model = Model::from_weights(c, core.params().weights(), nullptr);
  // A copy left at the same addresses with other values (an earlier model's, e.g. an engine's upload).
  ASSERT_TRUE(model->to_device(dev).ok());
  ModelParams& host = core.host_state().params;
  for (int64_t i = 0; i < host.n_values(); ++i) host.data()[i] += 0.5f;
  const std::vector<float> initial(host.data(), host.data() + host.n_values());
  {
    auto first = DeviceTraining::start(dev, *model, &core, DeviceBatchShape{});
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    ASSERT_TRUE((*first)->sync_to_host(dev, core).ok());
    EXPECT_TRUE(std::equal(initial.begin(), initial.end(), core.params().data())) << "the trainer started from a stale copy";
    ModelParams g = ModelParams::zeros(c);
    fill_gradients(g, 5);
    ASSERT_TRUE((*first)->grads().upload(dev, g).ok());
    auto s = (*first)->step(dev, core, 1.0);  // the device's weights move; the host's stay (no sync)
    ASSERT_TRUE(s.ok() && !s->skipped) << s.status().to_string();
  }
  EXPECT_EQ((*backend)->weight_bytes(), 0) << "the first trainer's weight copies outlived it";
  auto second = DeviceTraining::start(dev, *model, &core, DeviceBatchShape{});
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_TRUE((*second)->sync_to_host(dev, core).ok());
  EXPECT_TRUE(std::equal(initial.begin(), initial.end(), core.params().data()))
      << "the second trainer started from the first one's updated device copies";
}

}  // namespace
}  // namespace dc::train
