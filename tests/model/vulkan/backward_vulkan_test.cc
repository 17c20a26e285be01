// Model::backward on the Vulkan device (device 0: lavapipe in CI) against the CPU's reference backward:
// a training-mode forward on the device keeps the activations in device memory, the loss comes from the
// device's logits, and every gradient (DeviceParams, downloaded) is compared with the CPU's, tensor by
// tensor (values and norm); gradient checkpointing on the device gives the same gradients bit for bit.
// Tolerances: the loss within 1e-5 relative; each gradient's max |Δ| within kGradTolerance of its largest |value|
// and its norm within kGradTolerance relative (f32 on both sides, summed in other orders).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "batch_case.h"
#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "model/device_params.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "ops/loss.h"
#include "train_batch.h"
#include "vulkan_test_config.h"

namespace dc {
namespace {

constexpr double kGradTolerance = 1e-5;

// One case: the CPU's training forward, loss and backward (reference kernels) against the device's.
void check_backward_case(const ModelConfig& c, const std::string& label) {
  SCOPED_TRACE(label);
  ThreadPool pool(2);
  auto synthetic = make_synthetic_model(c, 11, &pool, nullptr);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().to_string();
  auto params = ModelParams::from_weights(c, (*synthetic)->weights());  // f32 master weights, as the trainer's
  ASSERT_TRUE(params.ok()) << params.status().to_string();
  const auto model = Model::from_weights(c, params->weights(), nullptr);
  const TrainBatch k = make_train_batch(2, 13, c.n_vocab, 5);
  const ForwardBatch fb = k.view();
  const int64_t V = c.n_vocab, n_out = fb.n_out;

  Context cpu{Device::kCpu, &pool};
  cpu.reference_kernels = true;
  std::vector<float> want_logits(n_out * V);
  Activations cpu_acts;
  ASSERT_TRUE(model->forward(cpu, fb, want_logits.data(), nullptr, &cpu_acts).ok());
  const double want_loss = loss_and_dlogits(k, V, want_logits);
  ModelParams want = ModelParams::zeros(c);
  ASSERT_TRUE(model->backward(cpu, cpu_acts, want_logits.data(), want.spans(), nullptr, GradWrite::kOverwrite).ok());

  std::unique_ptr<DeviceBackend> backend;
  const Context dev = device_with_weights(*model, &pool, &backend);
  ASSERT_NE(backend, nullptr);
  auto grads = DeviceParams::zeros(dev, c);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  // Gradient checkpointing off, then on (into the same device gradients, overwritten).
  std::vector<float> plain_values;
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "kept activations");
    std::vector<float> logits(n_out * V, NAN);
    Activations acts;
    acts.recompute = recompute;
    const Status fs = model->forward(dev, fb, logits.data(), nullptr, &acts);
    ASSERT_TRUE(fs.ok()) << fs.to_string();
    EXPECT_EQ(acts.device(), Device::kVulkan);
    const double loss = loss_and_dlogits(k, V, logits);
    EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
    const float* dlogits = upload_floats(*backend, "test.dlogits", logits);
    const Status bs = model->backward(dev, acts, dlogits, grads->spans(), nullptr, GradWrite::kOverwrite);
    ASSERT_TRUE(bs.ok()) << bs.to_string();
    ModelParams got = ModelParams::zeros(c);
    const Status ds = grads->download(dev, got);
    ASSERT_TRUE(ds.ok()) << ds.to_string();
    double worst = 0;
    for (size_t t = 0; t < want.tensors().size(); ++t) {
      const ModelParams::Tensor& w = want.tensors()[t];
      const ModelParams::Tensor& g = got.tensors()[t];
      double max_ref = 0, max_diff = 0;
      for (int64_t i = 0; i < w.size; ++i) {
        max_ref = std::max(max_ref, std::abs(static_cast<double>(w.data[i])));
        const double d = std::abs(static_cast<double>(g.data[i]) - w.data[i]);
        max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
      }
      ASSERT_GT(max_ref, 0) << w.name << ": a zero gradient tests nothing";
      const double rel = max_diff / max_ref, want_norm = l2_norm(w.data, w.size);
      EXPECT_LE(rel, kGradTolerance) << w.name;
      EXPECT_NEAR(l2_norm(g.data, g.size), want_norm, kGradTolerance * want_norm) << w.name;
      worst = std::max(worst, rel);
    }
    std::printf("  [%s%s] loss %.6f (CPU %.6f), worst gradient max |Δ| / max |value|: %.2e\n", label.c_str(),
                recompute ? ", recompute" : "", loss, want_loss, worst);
    const std::vector<float> values(got.data(), got.data() + got.n_values());
    if (!recompute) plain_values = values;
    else EXPECT_EQ(0, std::memcmp(values.data(), plain_values.data(), values.size() * sizeof(float)))
        << "gradient checkpointing changed the device's gradients";
  }
}

// A small checkpoint the device's attention takes (head_dim 16, GQA 4 / 2), untied and tied embeddings.
ModelConfig small_train_config(bool tied) {
  ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  c.tie_word_embeddings = tied;
  return c;
}

TEST(BackwardVulkan, EveryGradientMatchesTheCpu) { check_backward_case(small_train_config(false), "untied"); }

TEST(BackwardVulkan, TiedEmbeddingsMatchTheCpu) { check_backward_case(small_train_config(true), "tied"); }

// What the device does not train yet is refused by name, never run on the CPU instead.
TEST(BackwardVulkan, RefusesTheCpuOnlyParts) {
  const ModelConfig c = small_train_config(false);
  ThreadPool pool(2);
  auto synthetic = make_synthetic_model(c, 11, &pool, nullptr);
  ASSERT_TRUE(synthetic.ok());
  auto params = ModelParams::from_weights(c, (*synthetic)->weights());
  ASSERT_TRUE(params.ok());
  const auto model = Model::from_weights(c, params->weights(), nullptr);
  std::unique_ptr<DeviceBackend> backend;
  const Context dev = device_with_weights(*model, &pool, &backend);
  ASSERT_NE(backend, nullptr);
  const TrainBatch k = make_train_batch(1, 8, c.n_vocab, 3);
  std::vector<float> logits(k.batch.rows.size() * c.n_vocab);
  Activations cpu_acts;  // saved on the CPU: a device backward cannot read them
  Context cpu{Device::kCpu, &pool};
  ASSERT_TRUE(model->forward(cpu, k.view(), logits.data(), nullptr, &cpu_acts).ok());
  auto grads = DeviceParams::zeros(dev, c);
  ASSERT_TRUE(grads.ok());
  const float* dlogits = upload_floats(*backend, "test.dlogits", logits);
  Status s = model->backward(dev, cpu_acts, dlogits, grads->spans());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("another device"), std::string::npos) << s.message();
  ModelSpans hooked = grads->spans();  // ZeRO-2's per-layer hooks
  hooked.on_layer_done = [](int64_t) { return Status(); };
  Activations acts;
  ASSERT_TRUE(model->forward(dev, k.view(), logits.data(), nullptr, &acts).ok());
  s = model->backward(dev, acts, dlogits, hooked);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ZeRO-2"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace dc
