// The SFT Trainer on the Vulkan device (device 0: lavapipe in CI) against the same Trainer on the CPU
// (reference kernels, f32): two optimizer steps of two micro-batches each (the first writes the gradients,
// the second adds, both scaled by 1/grad_accum), clipped and with weight decay; the losses, the gradient
// norms and every updated weight within f32 bounds. A LoRA run (with the adapters' dropout) the same way, and its
// resume bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "devices.h"
#include "head_dim_16_policy.h"
#include "ops/device.h"
#include "temp_dir.h"
#include "update_distance.h"
#include "train/trainer.h"
#include "vulkan_test_config.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

// A checkpoint the device's attention takes (head_dim 16, GQA 4 / 2).
ModelConfig device_sized_config() { return testing::vulkan_test_config(4, 2, 16, 96); }

// n sequences of L random ids below `below` (the mask id), every position maskable.
Dataset random_data(int64_t n, int64_t L, uint64_t seed, uint64_t below = 298) {
  Dataset d;
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    TrainSequence s;
    for (int64_t j = 0; j < L; ++j) s.tokens.push_back(static_cast<int32_t>(splitmix64_next(state) % below));
    s.loss_mask.assign(L, 1);
    d.sequences.push_back(std::move(s));
  }
  return d;
}

// Two steps of 2 micro-batches of 2 × 16, clipped at a norm the gradients exceed, weight decay on. AdamW's eps
// is 1e-3 so that its update is Lipschitz in the gradient (lr / eps): with 1e-8 a gradient near zero would
// move its weight by ±lr on either side, whatever the last bits of the two devices' sums.
TrainOptions device_test_options() {
  TrainOptions o;
  o.seq_len = 16, o.batch_size = 2, o.grad_accum = 2, o.steps = 2;
  o.lr.lr = 1e-3, o.lr.warmup_steps = 0, o.lr.total_steps = 2;
  o.adam.eps = 1e-3, o.adam.weight_decay = 0.1;
  o.max_grad_norm = 0.5;
  o.precision = MatmulPrecision::kF32;
  return o;
}

std::unique_ptr<Trainer> make_trainer(const ModelConfig& c, const TrainOptions& o, const Context& ctx) {
  ThreadPool draw_pool(2);
  auto synthetic = make_synthetic_model(c, 21, &draw_pool, nullptr);
  EXPECT_TRUE(synthetic.ok());
  auto params = ModelParams::from_weights(c, (*synthetic)->weights());
  EXPECT_TRUE(params.ok());
  auto t = Trainer::create_with_params(o, ctx, c, std::move(*params), random_data(16, 16, 5));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// One SFT step on the CPU (`want`) and on the device (`got`): the loss and gradient norm within 1e-5 relative, the
// same rate, clipping on. Printed with `label`.
void expect_step_matches(Trainer& want, Trainer& got, int step, double max_grad_norm, const char* label) {
  auto w = want.step();
  auto g = got.step();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_FALSE(g->skipped);
  EXPECT_NEAR(g->loss, w->loss, 1e-5 * w->loss) << "step " << step;
  EXPECT_NEAR(g->grad_norm, w->grad_norm, 1e-5 * w->grad_norm) << "step " << step;
  EXPECT_GT(w->grad_norm, max_grad_norm) << "the test wants clipping on";
  EXPECT_EQ(g->lr, w->lr);
  std::printf("  %s %d: loss %.7f (CPU %.7f), |g| %.7f (CPU %.7f)\n", label, step, g->loss, w->loss, g->grad_norm, w->grad_norm);
}

TEST(TrainerVulkan, TwoStepsMatchTheCpu) {
  const ModelConfig c = device_sized_config();
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  const Context& cpu = d.cpu;
  const Context& dev = d.dev;
  auto want = make_trainer(c, device_test_options(), cpu);
  auto got = make_trainer(c, device_test_options(), dev);
  ASSERT_TRUE(want && got);
  for (int step = 1; step <= 2; ++step) expect_step_matches(*want, *got, step, device_test_options().max_grad_norm, "step");
  EXPECT_EQ(got->steps_done(), 2);
  ASSERT_TRUE(got->sync_to_host().ok());
  ThreadPool draw_pool(2);
  auto synthetic = make_synthetic_model(c, 21, &draw_pool, nullptr);
  auto initial = ModelParams::from_weights(c, (*synthetic)->weights());
  ASSERT_TRUE(initial.ok());
  double worst = 0;
  for (size_t t = 0; t < want->params().tensors().size(); ++t) {
    const ModelParams::Tensor& w = want->params().tensors()[t];
    const ModelParams::Tensor& g = got->params().tensors()[t];
    const ModelParams::Tensor& p0 = initial->tensors()[t];
    double max_step = 0, max_diff = 0;  // the CPU's update, and the device's distance from the CPU's weights
    for (int64_t i = 0; i < w.size; ++i) {
      max_step = std::max(max_step, std::abs(static_cast<double>(w.data[i]) - p0.data[i]));
      const double d = std::abs(static_cast<double>(g.data[i]) - w.data[i]);
      max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
    }
    ASSERT_GT(max_step, 0) << w.name << ": not updated";
    EXPECT_LE(max_diff, 2e-4 * max_step) << w.name << ": the device's weights are off the CPU's update";
    worst = std::max(worst, max_diff / max_step);
  }
  std::printf("  updated weights: worst max |Δ| / the largest update %.2e\n", worst);
  // The moments came back too.
  const ModelParams::Tensor& m_cpu = want->optimizer().m().tensors()[1];
  const ModelParams::Tensor& m_dev = got->optimizer().m().tensors()[1];
  double m_max = 0, m_diff = 0;
  for (int64_t i = 0; i < m_cpu.size; ++i)
    m_max = std::max(m_max, std::abs(static_cast<double>(m_cpu.data[i]))),
    m_diff = std::max(m_diff, std::abs(static_cast<double>(m_dev.data[i]) - m_cpu.data[i]));
  EXPECT_LE(m_diff, 1e-4 * m_max) << m_cpu.name;
}

// A LoRA run (adapters on every projection over the frozen grpo policy read with head_dim 16, dropout 0.1: each
// micro-batch's masks drawn on the device as on the CPU): two steps on the device against the CPU's (the losses, the adapters' gradient norms, the updated adapters and a moment within the
// full fine-tune's bounds); then the device run saved at step 2 (a PEFT checkpoint) and resumed on the device for
// step 3 equal bit for bit to the uninterrupted run's step 3.
TEST(TrainerVulkan, LoraStepsMatchTheCpuAndResumeBitForBit) {
  ASSERT_TRUE(fs::exists(kGrpoDir / ".complete")) << "run `ctest -R grpo_fixtures` first";
  const test::TempDir tmp("trainer_vulkan_lora");
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  const Context& cpu = d.cpu;
  const Context& dev = d.dev;
  TrainOptions o = device_test_options();
  fs::create_directories(tmp.file("policy"));
  o.model_dir = head_dim_16_policy(tmp.file("policy"));
  o.steps = o.lr.total_steps = 3;
  o.lora.r = 4, o.lora.alpha = 8, o.lora.dropout = 0.1f;
  o.lr.lr = 1e-2;  // the adapters start at B = 0: a visible first update
  auto create = [&](const Context& ctx, const std::string& out, bool resume) {
    TrainOptions to = o;
    to.out_dir = tmp.file(out), to.resume = resume;
    auto t = Trainer::create_with_data(to, ctx, random_data(16, 16, 5, 62));  // the policy's mask id: 62
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  };
  auto want = create(cpu, "cpu", false);
  auto got = create(dev, "device", false);
  ASSERT_TRUE(want && got);
  const std::vector<float> initial(want->lora()->params().data(), want->lora()->params().data() + want->lora()->params().n_values());
  for (int step = 1; step <= 2; ++step) expect_step_matches(*want, *got, step, o.max_grad_norm, "LoRA step");
  ASSERT_TRUE(got->save().ok());  // downloads the adapters and moments first
  const LoraParams& w = want->lora()->params();
  const LoraParams& g = got->lora()->params();
  ASSERT_EQ(w.n_values(), g.n_values());
  double worst = 0;
  for (const LoraParams::Tensor& t : w.tensors()) {
    const double rel = off_the_update(g.data() + t.offset, w.data() + t.offset, initial.data() + t.offset, t.size);
    EXPECT_LE(rel, 2e-4) << t.name << ": the device's adapters are off the CPU's update";
    worst = std::max(worst, rel);
  }
  std::printf("  updated adapters: worst max |Δ| / the largest update %.2e\n", worst);
    EXPECT_LE(off_the_update(got->lora()->m().data(), want->lora()->m().data(), nullptr, w.n_values()), 1e-4) << "m";
  EXPECT_TRUE(fs::exists(fs::path(tmp.file("device")) / "checkpoint-000002" / "adapter_model.safetensors"));

  auto whole = got->step();  // the uninterrupted run's step 3
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  ASSERT_TRUE(got->sync_to_host().ok());
  auto resumed = create(dev, "device", true);
  ASSERT_TRUE(resumed);
  EXPECT_EQ(resumed->steps_done(), 2);
  auto again = resumed->step();
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->loss, whole->loss);
  EXPECT_EQ(again->grad_norm, whole->grad_norm);
  ASSERT_TRUE(resumed->sync_to_host().ok());
  EXPECT_EQ(0, std::memcmp(resumed->lora()->params().data(), got->lora()->params().data(), w.n_values() * sizeof(float)))
      << "the resumed run's adapters differ from the uninterrupted run's";
  EXPECT_EQ(0, std::memcmp(resumed->lora()->v().data(), got->lora()->v().data(), w.n_values() * sizeof(float)));
}

}  // namespace
}  // namespace dc::train
