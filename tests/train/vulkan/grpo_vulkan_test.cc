// Coupled-GRPO on the Vulkan device (device 0: lavapipe in CI) against the CPU (reference kernels, f32): the
// coupled log-probs and the loss with its gradient (grpo_loss_and_device_grads: ratio and clipping on, a KL
// against a second model on the device) on a synthetic checkpoint; then GrpoTrainer's steps on the grpo fixtures'
// policy read with head_dim 16 — rollouts, old and reference log-probs, the loss and its backward, clipping and
// AdamW on the device, the reference model's sync uploaded — equal to the CPU's within f32 bounds (loss, KL,
// gradient norm, the updated policy and reference weights), a resumed device run equal to the uninterrupted one
// bit for bit, and a LoRA run with the adapters' dropout the same way (its policy and reference adapters, its
// resume).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "gguf/model_source.h"
#include "devices.h"
#include "head_dim_16_policy.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "ops/device.h"
#include "relative_distance.h"
#include "temp_dir.h"
#include "train/device_training.h"
#include "train/grpo_loss.h"
#include "train/grpo_trainer.h"
#include "train/tiny_grpo.h"
#include "devices.h"
#include "head_dim_16_policy.h"
#include "update_distance.h"
#include "vulkan_test_config.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

// B = 4 completions of C = 5 tokens after prompts of 3 (the last completion's mask ending early).
GrpoBatch random_batch(uint64_t seed) {
  GrpoBatch b;
  b.n_batch = 4, b.n_prompt = 3, b.n_completion = 5;
  uint64_t state = seed;
  for (int64_t i = 0; i < b.n_batch * b.n_prompt; ++i) b.prompt_ids.push_back(static_cast<int32_t>(splitmix64_next(state) % 298));
  for (int64_t i = 0; i < b.n_batch * b.n_completion; ++i)
    b.completion_ids.push_back(static_cast<int32_t>(splitmix64_next(state) % 298));
  b.completion_mask.assign(b.n_batch * b.n_completion, 1);
  b.completion_mask[b.n_batch * b.n_completion - 1] = b.completion_mask[b.n_batch * b.n_completion - 2] = 0;
  return b;
}

TEST(GrpoVulkan, LossAndGradientsMatchTheCpu) {
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  auto policy = make_synthetic_model(c, 31, &d.pool, nullptr).value();
  auto ref = make_synthetic_model(c, 32, &d.pool, nullptr).value();
  auto params = ModelParams::from_weights(c, policy->weights()).value();  // f32 copies: a trainer's weights
  auto ref_params = ModelParams::from_weights(c, ref->weights()).value();
  auto policy_f32 = Model::from_weights(c, params.weights(), nullptr);
  auto ref_f32 = Model::from_weights(c, ref_params.weights(), nullptr);
  const GrpoBatch batch = random_batch(7);
  auto rows = coupled_rows(batch, draw_coupled_mask(batch.n_batch, batch.n_completion, 11), 298, c.n_vocab, false);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  DeviceBatchShape shape;
  shape.positions = rows->n_batch * rows->n_seq, shape.loss_rows = static_cast<int64_t>(rows->out_rows.size());
  auto device = DeviceTraining::start(d.dev, *policy_f32, nullptr, shape, /*reference=*/true);
  ASSERT_TRUE(device.ok()) << device.status().to_string();
  ASSERT_TRUE((*device)->upload_reference(d.dev, *ref_f32).ok());
  // The reference's log-probs on either device.
  auto ref_cpu = coupled_logps(d.cpu, *ref_f32, *rows, batch.n_completion);
  auto ref_dev = coupled_logps(d.dev, *ref_f32, *rows, batch.n_completion, &(*device)->rows());
  ASSERT_TRUE(ref_cpu.ok() && ref_dev.ok());
  EXPECT_LE(relative_distance(ref_dev->data(), ref_cpu->data(), static_cast<int64_t>(ref_cpu->size())), 1e-5);
  // old = the policy's own log-probs shifted by ±0.4, so that some ratios leave [0.8, 1.2] and clip.
  auto old = coupled_logps(d.cpu, *policy_f32, *rows, batch.n_completion);
  ASSERT_TRUE(old.ok());
  for (size_t i = 0; i < old->size(); ++i) (*old)[i] += (i % 3 == 0 ? 0.4f : i % 3 == 1 ? -0.4f : 0.05f);

  GrpoLossInputs in;
  in.batch = &batch, in.rows = &*rows, in.advantages = {1.5, -0.5, 0.25, -1.25};
  in.old_logps = *old, in.ref_logps = *ref_cpu;
  GrpoLossOptions o;
  o.beta = 0.3, o.epsilon = 0.2;
  const float scale = 0.5f;
  ModelParams want = ModelParams::zeros(c), got = ModelParams::zeros(c);
  Activations acts_cpu, acts_dev;
  auto w = grpo_loss_and_grads(d.cpu, *policy_f32, in, o, scale, want, acts_cpu, nullptr, GradWrite::kOverwrite);
  in.ref_logps = *ref_dev;
  auto g = grpo_loss_and_device_grads(d.dev, *policy_f32, in, o, scale, **device, acts_dev, GradWrite::kOverwrite);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_GT(w->clip_fraction, 0.0) << "the test wants clipping on";
  ASSERT_LT(w->clip_fraction, 1.0);
  EXPECT_NEAR(g->loss, w->loss, 1e-5 * std::abs(w->loss));
  EXPECT_NEAR(g->kl, w->kl, 1e-5 * w->kl);
  EXPECT_EQ(g->clip_fraction, w->clip_fraction);
  EXPECT_LE(relative_distance(g->logps.data(), w->logps.data(), static_cast<int64_t>(w->logps.size())), 1e-5);
  ASSERT_TRUE((*device)->grads().download(d.dev, got).ok());
  double worst = 0;
  for (size_t t = 0; t < want.tensors().size(); ++t) {
    const ModelParams::Tensor& wt = want.tensors()[t];
    const double r = relative_distance(got.tensors()[t].data, wt.data, wt.size);
    EXPECT_LE(r, 1e-5) << wt.name;
    worst = std::max(worst, r);
  }
  std::printf("  loss %.8f (CPU %.8f), kl %.8f (CPU %.8f), clip %.3f; gradients: worst max |Δ| / max |g| %.2e\n", g->loss,
              w->loss, g->kl, w->kl, w->clip_fraction, worst);
}

// Two rounds of two iterations, clipped, the reference synced every step (its second round's log-probs read
// the mixed weights, uploaded); AdamW's eps 1e-3 keeps its update Lipschitz in the gradient (as the SFT test).
GrpoOptions device_grpo_options(const std::string& model_dir) {
  GrpoOptions o = tiny_grpo_options(4);
  o.model_dir = model_dir;
  o.adam.eps = 1e-3, o.adam.weight_decay = 0.1;
  o.max_grad_norm = 0.05;
  o.loss.beta = 0.05;
  o.ref_sync_steps = 1;
  return o;
}

std::unique_ptr<GrpoTrainer> make_grpo(const GrpoOptions& o, const Context& ctx) {
  auto t = GrpoTrainer::create(o, ctx, sampler_rollout(8, 4, 7, false));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// One GRPO step on the CPU (`want`) and on the device (`got`): the same rewards (the same rollouts), the loss, KL and
// gradient norm within 1e-5 relative, the KL with an absolute part `kl_abs` (a small KL's error does not scale
// with it: see the LoRA test), and the CPU's norm above max_grad_norm (clipping on). Printed with `label`.
void expect_step_matches(GrpoTrainer& want, GrpoTrainer& got, int step, double max_grad_norm, double kl_abs,
                         const char* label) {
  auto w = want.step();
  auto g = got.step();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_FALSE(g->skipped);
  EXPECT_EQ(g->reward_mean, w->reward_mean) << "step " << step << ": the device's rollouts differ from the CPU's";
  EXPECT_NEAR(g->loss, w->loss, 1e-5 * std::abs(w->loss) + 1e-7) << "step " << step;
  EXPECT_NEAR(g->kl, w->kl, 1e-5 * w->kl + kl_abs) << "step " << step;
  EXPECT_NEAR(g->grad_norm, w->grad_norm, 1e-5 * w->grad_norm) << "step " << step;
  EXPECT_GT(w->grad_norm, max_grad_norm) << "the test wants clipping on";
  std::printf("  %s %d: loss %.8f (CPU %.8f), kl %.3e (CPU %.3e), |g| %.7f (CPU %.7f)\n", label, step, g->loss, w->loss,
              g->kl, w->kl, g->grad_norm, w->grad_norm);
}

// The run of `o` resumed from its checkpoint on a fresh backend (`fresh`, as a resumed process has: a backend keys its
// weight copies by the host weights' addresses, which a destroyed trainer's may share: train/device_training.h),
// from step 2 to step 4, its state downloaded.
std::unique_ptr<GrpoTrainer> resume_to_step_4(GrpoOptions o, const Devices& fresh) {
  o.resume = true;
  auto rest = make_grpo(o, fresh.dev);
  EXPECT_NE(rest, nullptr);
  if (rest == nullptr) return nullptr;
  EXPECT_EQ(rest->steps_done(), 2);
  while (rest->steps_done() < 4) {
    auto s = rest->step();
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return nullptr;
  }
  EXPECT_TRUE(rest->sync_to_host().ok());
  return rest;
}

class GrpoTrainerVulkan : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kGrpoDir / ".complete")) << "run `ctest -R grpo_fixtures` first";
    ASSERT_NE(d_.backend, nullptr);
    model_dir_ = head_dim_16_policy(dir_.path());
  }
  test::TempDir dir_{"grpo_vulkan"};
  Devices d_;
  std::string model_dir_;
};

TEST_F(GrpoTrainerVulkan, StepsMatchTheCpu) {
  const GrpoOptions o = device_grpo_options(model_dir_);
  auto want = make_grpo(o, d_.cpu);
  auto got = make_grpo(o, d_.dev);
  ASSERT_TRUE(want && got);
  for (int step = 1; step <= 4; ++step) expect_step_matches(*want, *got, step, o.max_grad_norm, 1e-9, "step");
  ASSERT_TRUE(got->sync_to_host().ok());
  ModelConfig config;
  auto initial = load_trainable_params(model_dir_, &config);
  ASSERT_TRUE(initial.ok());
  double worst = 0;
  for (size_t t = 0; t < want->params().tensors().size(); ++t) {
    const ModelParams::Tensor& w = want->params().tensors()[t];
    const ModelParams::Tensor& p0 = initial->tensors()[t];
    double max_step = 0;  // the CPU's update
    for (int64_t i = 0; i < w.size; ++i) max_step = std::max(max_step, std::abs(static_cast<double>(w.data[i]) - p0.data[i]));
    ASSERT_GT(max_step, 0) << w.name << ": not updated";
    for (const auto& [name, mine, theirs] : {std::tuple{"policy", &got->params(), &want->params()},
                                             std::tuple{"reference", &got->ref_params(), &want->ref_params()}}) {
      const float* a = mine->tensors()[t].data;
      const float* b = theirs->tensors()[t].data;
      double diff = 0;
      for (int64_t i = 0; i < w.size; ++i) {
        const double x = std::abs(static_cast<double>(a[i]) - b[i]);
        diff = std::isnan(x) ? INFINITY : std::max(diff, x);
      }
      EXPECT_LE(diff, 2e-4 * max_step) << name << " " << w.name << ": the device's weights are off the CPU's update";
      worst = std::max(worst, diff / max_step);
    }
  }
  std::printf("  policy and reference weights: worst max |Δ| / the largest update %.2e\n", worst);
}

// A device run saved after its first round and resumed (weights, reference model and moments uploaded from the
// checkpoint) ends bit for bit where the uninterrupted device run does.
TEST_F(GrpoTrainerVulkan, ResumedRunIsBitIdentical) {
  GrpoOptions o = device_grpo_options(model_dir_);
  o.out_dir = dir_.file("whole");
  auto whole = make_grpo(o, d_.dev);
  ASSERT_NE(whole, nullptr);
  while (whole->steps_done() < 4) ASSERT_TRUE(whole->step().ok());
  ASSERT_TRUE(whole->save().ok());
  o.out_dir = dir_.file("split");
  {
    auto first = make_grpo(o, d_.dev);
    ASSERT_NE(first, nullptr);
    while (first->steps_done() < 2) ASSERT_TRUE(first->step().ok());
    ASSERT_TRUE(first->save().ok());
  }
  Devices fresh;
  ASSERT_NE(fresh.backend, nullptr);
  const auto rest = resume_to_step_4(o, fresh);
  ASSERT_NE(rest, nullptr);
  for (size_t t = 0; t < whole->params().tensors().size(); ++t) {
    const ModelParams::Tensor& a = whole->params().tensors()[t];
    EXPECT_EQ(std::memcmp(a.data, rest->params().tensors()[t].data, a.size * sizeof(float)), 0) << a.name;
    EXPECT_EQ(std::memcmp(whole->ref_params().tensors()[t].data, rest->ref_params().tensors()[t].data, a.size * sizeof(float)), 0)
        << "reference " << a.name;
  }
}

// A LoRA run (rank 4 on every projection over the frozen policy, dropout 0.05: the training forwards' masks the
// CPU's) on the device against the CPU's: four steps (the
// rollouts, old and reference log-probs through the adapters, the reference adapters mixed every step and
// refreshed on the device) with the same rewards, loss, KL and gradient norm within 1e-5 and the policy's and the
// reference's adapters within 2e-4 of the CPU's largest update; then a device run saved after its first round and
// resumed on a fresh backend ends bit for bit where the uninterrupted one does.
TEST_F(GrpoTrainerVulkan, LoraStepsMatchTheCpuAndResumeBitForBit) {
  GrpoOptions o = device_grpo_options(model_dir_);
  o.lora.r = 4, o.lora.alpha = 8, o.lora.dropout = 0.05f;
  o.out_dir = dir_.file("lora_cpu");
  auto want = make_grpo(o, d_.cpu);
  o.out_dir = dir_.file("lora_whole");
  auto got = make_grpo(o, d_.dev);
  ASSERT_TRUE(want && got);
  const LoraParams& w = want->lora_core()->params();
  const std::vector<float> initial(w.data(), w.data() + w.n_values());
  for (int step = 1; step <= 4; ++step) {
    // KL ≈ δ²/2 of the log-prob gaps δ: its error is about |δ| times theirs (1e-6 of log-probs of a few units),
    // so a small KL (2.6e-3 here) has an absolute part; measured 3.4e-8 at step 3.
    expect_step_matches(*want, *got, step, /*max_grad_norm=*/0, 1e-7, "LoRA step");  // (clipping not asked)
    if (step == 2) ASSERT_TRUE(got->save().ok());  // a round boundary
  }
  ASSERT_TRUE(got->sync_to_host().ok());
  const LoraParams& g = got->lora_core()->params();
  const double policy = off_the_update(g.data(), w.data(), initial.data(), w.n_values());
  const double reference = off_the_update(got->ref_adapters()->data(), want->ref_adapters()->data(), initial.data(), w.n_values());
  EXPECT_LE(policy, 2e-4) << "the device's adapters are off the CPU's update";
  EXPECT_LE(reference, 2e-4) << "the device's reference adapters are off the CPU's";
  std::printf("  adapters: max |Δ| / the largest update %.2e (policy), %.2e (reference)\n", policy, reference);

  Devices fresh;  // a resumed process's backend
  ASSERT_NE(fresh.backend, nullptr);
  const auto rest = resume_to_step_4(o, fresh);
  ASSERT_NE(rest, nullptr);
  EXPECT_EQ(0, std::memcmp(rest->lora_core()->params().data(), g.data(), g.n_values() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(rest->ref_adapters()->data(), got->ref_adapters()->data(), g.n_values() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(rest->lora_core()->m().data(), got->lora_core()->m().data(), g.n_values() * sizeof(float)));
}

}  // namespace
}  // namespace dc::train
