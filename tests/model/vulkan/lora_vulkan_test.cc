// Unmerged LoRA adapters on the Vulkan device (device 0: lavapipe in CI) against the CPU's reference kernels:
// one projection's forward and backward (model/lora_project.h: y, u, dx, dA, dB), then a tiny model's
// training forward and Model::backward_lora into DeviceLora gradients (the loss and every adapter gradient),
// gradient checkpointing bit for bit; each without the adapters' dropout and with it (the CPU's mask).
// Tolerances: as backward_vulkan_test.cc's, max |Δ| within 1e-5 of the largest |value| (f32 on both sides,
// summed in other orders).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "lora/device_lora.h"
#include "lora/trainable.h"
#include "model/lora_project.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "train_batch.h"
#include "vulkan_test_config.h"

namespace dc {
namespace {

constexpr double kLoraTolerance = 1e-5;

// n values uniform in [lo, hi), a function of the seed.
std::vector<float> lora_random(uint64_t seed, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = lo + (hi - lo) * static_cast<float>(splitmix64_next(seed) >> 40) / static_cast<float>(1 << 24);
  return v;
}

// max |got − want| / max |want| (infinite for a NaN), failing on a zero reference, which would test nothing.
double lora_rel_error(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  EXPECT_EQ(want.size(), got.size()) << what;
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(want[i])));
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    max_diff = std::isnan(d) ? INFINITY : std::max(max_diff, d);
  }
  EXPECT_GT(max_ref, 0) << what << ": a zero reference tests nothing";
  return max_diff / max_ref;
}

// host[n] in device memory of its own (a DeviceMemory, so an operand of any op).
std::unique_ptr<DeviceMemory> on_device(const Context& dev, const std::vector<float>& host) {
  auto memory = dev.backend->allocate(static_cast<int64_t>(host.size() * sizeof(float)), "test data");
  EXPECT_TRUE(memory.ok()) << memory.status().to_string();
  const std::unique_lock<std::mutex> lock = dev.backend->lock();
  EXPECT_TRUE(dev.backend->begin().ok());
  const float* staged = device_copy(dev, "test.upload", host.data(), static_cast<int64_t>(host.size()));
  copy_floats(dev, staged, static_cast<int64_t>(host.size()), as_operand((*memory)->data()));
  EXPECT_TRUE(dev.backend->finish().ok());
  return std::move(memory).value();
}

std::vector<float> from_device(const Context& dev, const DeviceMemory& memory, size_t n) {
  std::vector<float> host(n, NAN);
  const std::unique_lock<std::mutex> lock = dev.backend->lock();
  EXPECT_TRUE(dev.backend->begin().ok());
  dev.backend->copy_out("test.download", memory.data(), host.data(), static_cast<int64_t>(n * sizeof(float)));
  const Status s = dev.backend->finish();
  EXPECT_TRUE(s.ok()) << s.to_string();
  return host;
}

// One adapted projection (x [T, in] → y [T, out], rank r) forward and backward on both devices: y and u, then
// dx, dA and dB added into random starting values; without dropout and with it (the device draws the CPU's mask).
TEST(LoraVulkan, ProjectionForwardAndBackwardMatchTheCpu) {
  const int64_t T = 11, in = 48, out = 40, r = 3;
  const std::vector<float> x = lora_random(1, T * in), w = lora_random(2, out * in), bias = lora_random(3, out);
  const std::vector<float> a = lora_random(4, r * in), b = lora_random(5, out * r), dy = lora_random(6, T * out);
  const std::vector<float> dx0 = lora_random(7, T * in), da0 = lora_random(8, r * in), db0 = lora_random(9, out * r);
  const WeightView wv{DType::kF32, w.data(), out, in};
  ThreadPool pool(2);
  Context cpu{Device::kCpu, &pool};
  cpu.reference_kernels = true;
  auto backend = open_vulkan_backend(0);
  ASSERT_TRUE(backend.ok()) << backend.status().to_string();
  Context dev{Device::kVulkan, &pool};
  dev.backend = backend->get();
  ASSERT_TRUE(dev.backend->add_matrix(wv, "w").ok());
  ASSERT_TRUE(dev.backend->add_vector(bias.data(), out, "bias").ok());
  ASSERT_TRUE(dev.backend->add_matrix(WeightView{DType::kF32, a.data(), r, in}, "A").ok());
  ASSERT_TRUE(dev.backend->add_matrix(WeightView{DType::kF32, b.data(), out, r}, "B").ok());
  for (const float dropout : {0.0f, 0.3f}) {
    SCOPED_TRACE("dropout " + std::to_string(dropout));
    LoraWeights lora;
    lora.layers.resize(2);
    lora.layers[1][kLoraV] = LoraMatrix{a.data(), b.data(), r, 0.75f};
    lora.dropout = dropout, lora.dropout_key = 99;
    const LoraSite site{&lora, 1, kLoraV};
    std::vector<float> y(T * out), u(T * r), dx = dx0, da = da0, db = db0;
    lora_project(cpu, x.data(), T, wv, bias.data(), y.data(), site, /*training=*/true, u.data());
    const LoraGradMatrix g{da.data(), db.data()};
    lora_project_backward(cpu, x.data(), T, wv, dy.data(), dx.data(), nullptr, nullptr, nullptr, GradWrite::kAdd,
                          GradWrite::kAdd, site, u.data(), &g);
    const auto d_x = on_device(dev, x), d_dy = on_device(dev, dy), d_y = on_device(dev, y), d_u = on_device(dev, u);
    const auto d_dx = on_device(dev, dx0), d_da = on_device(dev, da0), d_db = on_device(dev, db0);
    {
      const std::unique_lock<std::mutex> lock = dev.backend->lock();
      ASSERT_TRUE(dev.backend->begin().ok());
      const float* xp = as_operand(device_cast<const float>(d_x->data()));
      float* up = as_operand(d_u->data());
      lora_project(dev, xp, T, wv, bias.data(), as_operand(d_y->data()), site, /*training=*/true, up);
      const LoraGradMatrix dg{as_operand(d_da->data()), as_operand(d_db->data())};
      lora_project_backward(dev, xp, T, wv, as_operand(device_cast<const float>(d_dy->data())), as_operand(d_dx->data()),
                            nullptr, nullptr, nullptr, GradWrite::kAdd, GradWrite::kAdd, site, up, &dg);
      const Status s = dev.backend->finish();
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    EXPECT_LE(lora_rel_error(y, from_device(dev, *d_y, y.size()), "y"), kLoraTolerance);
    EXPECT_LE(lora_rel_error(u, from_device(dev, *d_u, u.size()), "u"), kLoraTolerance);
    EXPECT_LE(lora_rel_error(dx, from_device(dev, *d_dx, dx.size()), "dx"), kLoraTolerance);
    EXPECT_LE(lora_rel_error(da, from_device(dev, *d_da, da.size()), "dA"), kLoraTolerance);
    EXPECT_LE(lora_rel_error(db, from_device(dev, *d_db, db.size()), "dB"), kLoraTolerance);
  }
}

// Adapters on every projection of a small checkpoint, B drawn at random (PEFT's zero B would give dA = 0).
LoraParams random_adapters(const ModelConfig& c) {
  LoraSpec spec;
  spec.r = 4, spec.alpha = 8;
  LoraParams lora = LoraParams::zeros(c, spec);
  lora.init_peft(7);
  for (const LoraParams::Tensor& t : lora.tensors())
    if (t.name.find("lora_B") != std::string::npos) {
      const std::vector<float> v = lora_random(static_cast<uint64_t>(t.offset) + 1, t.size, -0.1f, 0.1f);
      std::memcpy(lora.data() + t.offset, v.data(), v.size() * sizeof(float));
    }
  return lora;
}

// A tiny model's training forward and backward_lora on the device against the CPU's: the loss and every adapter
// gradient, with kept activations and with gradient checkpointing (bit for bit the same on the device); without
// dropout and with it (each projection's mask drawn again in the backward, the CPU's).
TEST(LoraVulkan, ModelBackwardLoraMatchesTheCpu) {
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  ThreadPool pool(2);
  auto synthetic = make_synthetic_model(c, 11, &pool, nullptr);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().to_string();
  auto params = ModelParams::from_weights(c, (*synthetic)->weights());
  ASSERT_TRUE(params.ok()) << params.status().to_string();
  const auto model = Model::from_weights(c, params->weights(), nullptr);
  const LoraParams lora = random_adapters(c);
  const TrainBatch k = make_train_batch(2, 13, c.n_vocab, 5);
  const int64_t V = c.n_vocab;
  std::unique_ptr<DeviceBackend> backend;
  const Context dev = device_with_weights(*model, &pool, &backend);
  ASSERT_NE(backend, nullptr);
  auto grads = DeviceLora::zeros_like(dev, lora);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  Context cpu{Device::kCpu, &pool};
  cpu.reference_kernels = true;
  std::vector<float> without_dropout;  // the CPU's logits without dropout: dropout must change them
  for (const float dropout : {0.0f, 0.2f}) {
    LoraWeights adapters = lora.weights();
    adapters.dropout = dropout, adapters.dropout_key = 17;
    ForwardBatch fb = k.view();
    fb.lora = &adapters;
    const int64_t n_out = fb.n_out;
    std::vector<float> want_logits(n_out * V);
    Activations cpu_acts;
    ASSERT_TRUE(model->forward(cpu, fb, want_logits.data(), nullptr, &cpu_acts).ok());
    const std::vector<float> forward_logits = want_logits;
    if (dropout == 0.0f) without_dropout = forward_logits;
    else EXPECT_GT(lora_rel_error(without_dropout, forward_logits, "dropout's effect"), 1e-4) << "the dropout changed nothing";
    const double want_loss = loss_and_dlogits(k, V, want_logits);
    LoraParams want = LoraParams::zeros_like(lora);
    ASSERT_TRUE(model->backward_lora(cpu, cpu_acts, want_logits.data(), adapters, want.grads()).ok());
    std::vector<float> plain;
    for (const bool recompute : {false, true}) {
      SCOPED_TRACE(std::string(recompute ? "recompute" : "kept activations") + ", dropout " + std::to_string(dropout));
      ASSERT_TRUE(grads->zero(dev).ok());
      std::vector<float> logits(n_out * V, NAN);
      Activations acts;
      acts.recompute = recompute;
      const Status fs = model->forward(dev, fb, logits.data(), nullptr, &acts);
      ASSERT_TRUE(fs.ok()) << fs.to_string();
      EXPECT_LE(lora_rel_error(forward_logits, logits, "logits"), 1e-4);  // the forward tests' bound
      const double loss = loss_and_dlogits(k, V, logits);
      EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
      const float* dlogits = upload_floats(*backend, "test.dlogits", logits);
      const Status bs = model->backward_lora(dev, acts, dlogits, adapters, grads->grads());
      ASSERT_TRUE(bs.ok()) << bs.to_string();
      LoraParams got = LoraParams::zeros_like(lora);
      ASSERT_TRUE(grads->download(dev, got).ok());
      double worst = 0;
      for (const LoraParams::Tensor& t : want.tensors()) {
        const std::vector<float> w(want.data() + t.offset, want.data() + t.offset + t.size);
        const std::vector<float> g(got.data() + t.offset, got.data() + t.offset + t.size);
        const double rel = lora_rel_error(w, g, t.name);
        EXPECT_LE(rel, kLoraTolerance) << t.name;
        const double want_norm = l2_norm(w.data(), t.size);
        EXPECT_NEAR(l2_norm(g.data(), t.size), want_norm, kLoraTolerance * want_norm) << t.name;
        worst = std::max(worst, rel);
      }
      std::printf("  [LoRA, dropout %.1f%s] loss %.6f (CPU %.6f), worst adapter gradient max |Δ| / max |value|: %.2e\n",
                  dropout, recompute ? ", recompute" : "", loss, want_loss, worst);
      const std::vector<float> values(got.data(), got.data() + got.n_values());
      if (!recompute) plain = values;
      else EXPECT_EQ(0, std::memcmp(values.data(), plain.data(), values.size() * sizeof(float)))
          << "gradient checkpointing changed the device's adapter gradients";
    }
  }
}

}  // namespace
}  // namespace dc
