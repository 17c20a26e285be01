// Model::backward against PyTorch autograd on tests/reference/dream_ref.py (fixtures from
// make_grad_fixtures.py): the masked-diffusion loss and every parameter gradient of a tiny random
// checkpoint, for a plain and a left-padded batch; plus training mode leaving the forward unchanged, and the
// backward started after the lm_head (BackwardFrom::hidden) equal to the one started at the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <tuple>

#include "fixtures.h"
#include "grad_case.h"
#include "io/safetensors.h"
#include "model/mixed_weights.h"
#include "model/params.h"
#include "model/transformer.h"
#include "ops/loss.h"
#include "ops/matmul.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = DC_GRAD_FIXTURES_DIR;

// The tiny training checkpoint as f32 parameters, and a context of GetParam() threads.
class GradParity : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kDir / ".complete")) << "run `ctest -R grad_fixtures` first";
    auto loaded = Model::load((kDir / "tiny-train").string());
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    cfg_ = (*loaded)->config();
    auto params = ModelParams::from_weights(cfg_, (*loaded)->weights());
    ASSERT_TRUE(params.ok()) << params.status().message();
    params_ = std::move(*params);
    pool_ = std::make_unique<ThreadPool>(GetParam());
    ctx_.pool = pool_.get();
  }
  ModelConfig cfg_;
  ModelParams params_;
  std::unique_ptr<ThreadPool> pool_;
  Context ctx_;
};

TEST_P(GradParity, LossAndEveryGradientMatchAutograd) {
  const ModelConfig& cfg = cfg_;
  const auto model = Model::from_weights(cfg, params_.weights(), nullptr);
  const Context ctx = ctx_;
  const auto cases = testing::load_json((kDir / "grad_cases.json").string());
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const GradCase k = make_grad_case(c, static_cast<int32_t>(cfg.mask_token_id));
    ForwardBatch fb = k.batch();
    const int64_t V = cfg.n_vocab, n_out = fb.n_out;
    std::vector<float> logits(n_out * V), plain(n_out * V);
    Activations acts;
    ASSERT_TRUE(model->forward(ctx, fb, logits.data(), nullptr, &acts).ok());
    ASSERT_TRUE(model->forward(ctx, fb, plain.data()).ok());
    for (int64_t i = 0; i < n_out * V; ++i) ASSERT_EQ(logits[i], plain[i]) << "training mode changed logit " << i;
    const double loss = cross_entropy(ctx, logits.data(), k.targets.data(), k.weights.data(), n_out, V, logits.data());
    EXPECT_NEAR(loss, c["loss"].get<double>(), 1e-5 * c["loss"].get<double>());
    ModelParams grads = ModelParams::zeros(cfg);
    ASSERT_TRUE(model->backward(ctx, acts, logits.data(), grads.spans()).ok());
    auto ref = SafetensorsFile::open((kDir / (c["name"].get<std::string>() + ".grads.safetensors")).string());
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    int checked = 0;
    for (const auto& t : grads.tensors()) {
      const TensorInfo* r = ref->find(t.name);
      ASSERT_NE(r, nullptr) << t.name;
      ASSERT_EQ(r->shape, t.shape) << t.name;
      const double d = grad_rel_diff(t.data, static_cast<const float*>(r->data), t.size);
      EXPECT_LE(d, 1e-4) << t.name << ": |Δ|/|ref| = " << d;
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<int>(ref->tensors().size()));

    // Gradient checkpointing (recompute each layer in the backward) gives the same gradients, bit for bit.
    Activations lean;
    lean.recompute = true;
    std::vector<float> dlogits(n_out * V);
    ASSERT_TRUE(model->forward(ctx, fb, dlogits.data(), nullptr, &lean).ok());
    for (int64_t i = 0; i < n_out * V; ++i) ASSERT_EQ(dlogits[i], plain[i]) << "recompute mode changed logit " << i;
    cross_entropy(ctx, dlogits.data(), k.targets.data(), k.weights.data(), n_out, V, dlogits.data());
    EXPECT_EQ(lean.layers[0].q, nullptr) << "recompute mode kept a layer's activations";
    ModelParams again = ModelParams::zeros(cfg);
    ASSERT_TRUE(model->backward(ctx, lean, dlogits.data(), again.spans()).ok());
    for (size_t i = 0; i < grads.tensors().size(); ++i) {
      const auto& want = grads.tensors()[i];
      ASSERT_EQ(0, std::memcmp(want.data, again.tensors()[i].data, want.size * sizeof(float))) << want.name;
    }

    // ZeRO-2's layout (ModelParams::zeros_sharing_slots): every layer writes one slot, which on_layer_done
    // empties from the last layer to the first, and the untied lm_head writes the embedding table's, which
    // on_head_done empties before any layer; copied out there, each layer's and the lm_head's gradients,
    // and the other tensors' in place, are the full buffer's bit for bit.
    ASSERT_FALSE(cfg.tie_word_embeddings);
    ModelParams shared = ModelParams::zeros_sharing_slots(cfg);
    const int64_t first = grads.find("model.layers.0.input_layernorm.weight")->offset;
    const int64_t layer_size = grads.find("model.layers.1.input_layernorm.weight")->offset - first;
    const ModelParams::Tensor& head = *grads.find("lm_head.weight");
    EXPECT_EQ(shared.n_values(), grads.n_values() - (cfg.n_layer - 1) * layer_size - head.size);
    std::vector<float> copied(grads.n_values(), 0.0f);  // the layers and the lm_head, in the full layout
    std::vector<int64_t> order;                          // -1: the head
    shared.set_head_done([&] {
      order.push_back(-1);
      std::copy_n(shared.data(), head.size, copied.data() + head.offset);
      std::fill_n(shared.data(), head.size, 0.0f);
      return Status();
    });
    shared.set_layer_done([&](int64_t il) {
      order.push_back(il);
      float* slot = shared.data() + shared.find("model.layers.0.input_layernorm.weight")->offset;
      std::copy_n(slot, layer_size, copied.data() + first + il * layer_size);
      std::fill_n(slot, layer_size, 0.0f);
      return Status();
    });
    ASSERT_TRUE(model->backward(ctx, lean, dlogits.data(), shared.spans()).ok());
    std::vector<int64_t> want_order{-1};
    for (int64_t il = cfg.n_layer - 1; il >= 0; --il) want_order.push_back(il);
    EXPECT_EQ(order, want_order);
    for (const auto& want : grads.tensors()) {
      const bool moved = want.name.rfind("model.layers.", 0) == 0 || want.name == head.name;
      const float* got = moved ? copied.data() + want.offset : shared.find(want.name)->data;
      ASSERT_EQ(0, std::memcmp(want.data, got, want.size * sizeof(float))) << want.name;
    }
  }
}

// bf16 mixed precision (the training default): loss and every gradient near the f32 autograd ones and
// near PyTorch's own mixed precision (autocast to bf16), with the bf16 wᵀ laid out once or made per call
// giving the same gradients up to summation order.
TEST_P(GradParity, MixedPrecisionNearF32AndAutocast) {
  const ModelConfig& cfg = cfg_;
  Context ctx = ctx_;
  ctx.matmul_precision = MatmulPrecision::kBF16;
  if (!bf16_backward(ctx)) GTEST_SKIP() << "no AVX512_BF16: the trainer runs f32 on this CPU";
  MixedPrecisionWeights mixed;
  ASSERT_TRUE(mixed.refresh(ctx, params_.weights()).ok());
  const auto model = Model::from_weights(cfg, mixed.forward(), nullptr);
  for (const auto& c : testing::load_json((kDir / "grad_cases.json").string())) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const GradCase k = make_grad_case(c, static_cast<int32_t>(cfg.mask_token_id));
    ForwardBatch fb = k.batch();
    const int64_t V = cfg.n_vocab, n_out = fb.n_out;
    std::vector<float> dlogits(n_out * V);
    Activations acts;
    ASSERT_TRUE(model->forward(ctx, fb, dlogits.data(), nullptr, &acts).ok());
    const double loss = cross_entropy(ctx, dlogits.data(), k.targets.data(), k.weights.data(), n_out, V, dlogits.data());
    const double f32_loss = c["loss"], autocast_loss = c["loss_bf16"];
    EXPECT_NEAR(loss, f32_loss, 1e-2 * f32_loss);
    EXPECT_NEAR(loss, autocast_loss, 1e-2 * autocast_loss);
    ModelParams grads = ModelParams::zeros(cfg), per_call = ModelParams::zeros(cfg);
    ASSERT_TRUE(model->backward(ctx, acts, dlogits.data(), grads.spans(), &mixed.transposed()).ok());
    ASSERT_TRUE(model->backward(ctx, acts, dlogits.data(), per_call.spans()).ok());
    auto f32 = SafetensorsFile::open((kDir / (name + ".grads.safetensors")).string());
    auto autocast = SafetensorsFile::open((kDir / (name + ".grads_autocast_bf16.safetensors")).string());
    ASSERT_TRUE(f32.ok() && autocast.ok());
    double worst_f32 = 0, worst_autocast = 0, any_difference = 0;
    for (size_t i = 0; i < grads.tensors().size(); ++i) {
      const auto& t = grads.tensors()[i];
      // Another kernel path (per-call packing) sums in another order, and the backward rounds its
      // intermediate gradients to bf16 again, which amplifies that: measured ≤ 3.3e-5 (ASan build).
      EXPECT_LE(grad_rel_diff(per_call.tensors()[i].data, t.data, t.size), 2e-4) << t.name << " (wᵀ made per call)";
      const double d32 = grad_rel_diff(t.data, static_cast<const float*>(f32->find(t.name)->data), t.size);
      const double dac = grad_rel_diff(t.data, static_cast<const float*>(autocast->find(t.name)->data), t.size);
      EXPECT_LE(d32, 2e-2) << t.name << ": |Δ|/|f32 autograd| = " << d32;
      EXPECT_LE(dac, 3e-2) << t.name << ": |Δ|/|autocast bf16 autograd| = " << dac;
      worst_f32 = std::max(worst_f32, d32), worst_autocast = std::max(worst_autocast, dac);
      any_difference = std::max(any_difference, d32);
    }
    EXPECT_GT(any_difference, 1e-6) << "the bf16 path gave f32's gradients: it did not run";
    std::printf("[ mixed    ] %s: loss %.6f (f32 %.6f, autocast %.6f); worst gradient |Δ|/|ref| vs f32 %.2e, "
                "vs autocast %.2e\n", name.c_str(), loss, f32_loss, autocast_loss, worst_f32, worst_autocast);
  }
}

// GradWrite::kOverwrite (the first micro-batch of a step, no zeroing pass): the same bits as adding into
// zeroed gradients, whatever the buffers held, in f32 and in mixed precision, with an untied lm_head
// (the embedding table's scatter zeroed first) and tied (the lm_head's dW writes the table first).
TEST_P(GradParity, OverwriteEqualsAddIntoZeros) {
  const auto c = testing::load_json((kDir / "grad_cases.json").string())[0];
  for (const bool tied : {false, true}) {
    for (const MatmulPrecision precision : {MatmulPrecision::kF32, MatmulPrecision::kBF16}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (precision == MatmulPrecision::kBF16 ? ", bf16" : ", f32"));
      Context ctx = ctx_;
      ctx.matmul_precision = precision;
      if (precision == MatmulPrecision::kBF16 && !bf16_backward(ctx)) continue;
      ModelConfig cfg = cfg_;
      cfg.tie_word_embeddings = tied;
      auto params = ModelParams::from_weights(cfg, params_.weights());
      ASSERT_TRUE(params.ok()) << params.status().message();
      MixedPrecisionWeights mixed;
      const bool bf16 = precision == MatmulPrecision::kBF16;
      if (bf16) {
        ASSERT_TRUE(mixed.refresh(ctx, params->weights()).ok());
      }
      const auto model = Model::from_weights(cfg, bf16 ? mixed.forward() : params->weights(), nullptr);
      const GradCase k = make_grad_case(c, static_cast<int32_t>(cfg.mask_token_id));
      ForwardBatch fb = k.batch();
      const int64_t n_out = fb.n_out;
      std::vector<float> dlogits(n_out * cfg.n_vocab);
      Activations acts;
      ASSERT_TRUE(model->forward(ctx, fb, dlogits.data(), nullptr, &acts).ok());
      cross_entropy(ctx, dlogits.data(), k.targets.data(), k.weights.data(), n_out, cfg.n_vocab, dlogits.data());
      ModelParams added = ModelParams::zeros(cfg), written = ModelParams::zeros(cfg);
      std::fill(written.data(), written.data() + written.n_values(), std::nanf(""));
      const ModelWeights* wt = bf16 ? &mixed.transposed() : nullptr;
      ASSERT_TRUE(model->backward(ctx, acts, dlogits.data(), added.spans(), wt).ok());
      ASSERT_TRUE(model->backward(ctx, acts, dlogits.data(), written.spans(), wt, GradWrite::kOverwrite).ok());
      for (size_t i = 0; i < added.tensors().size(); ++i) {
        const auto& want = added.tensors()[i];
        ASSERT_EQ(0, std::memcmp(want.data, written.tensors()[i].data, want.size * sizeof(float))) << want.name;
      }
    }
  }
}

// Backward started after the head (BackwardFrom::hidden: the caller ran Model::lm_head_backward, as a device trainer
// does chunk by chunk) gives backward(dlogits)'s gradients bit for bit when the head's backward runs over every row,
// tied and untied, written over NaNs; over two chunks of rows (the lm_head's dW written, then added) within f32
// rounding.
TEST_P(GradParity, StartedAfterTheHeadEqualsStartedAtTheLogits) {
  const auto cases = testing::load_json((kDir / "grad_cases.json").string());
  const auto& c = cases[1];  // left-padded
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ModelConfig cfg = cfg_;
    cfg.tie_word_embeddings = tied;
    auto params = ModelParams::from_weights(cfg, params_.weights());
    ASSERT_TRUE(params.ok()) << params.status().message();
    const auto model = Model::from_weights(cfg, params->weights(), nullptr);
    const GradCase k = make_grad_case(c, static_cast<int32_t>(cfg.mask_token_id));
    const ForwardBatch fb = k.batch();
    const int64_t n_out = fb.n_out, V = cfg.n_vocab, E = cfg.n_embd;
    ASSERT_GE(n_out, 3);
    std::vector<float> dlogits(n_out * V), dhidden(n_out * E);
    Activations acts;
    ASSERT_TRUE(model->forward(ctx_, fb, dlogits.data(), nullptr, &acts).ok());
    cross_entropy(ctx_, dlogits.data(), k.targets.data(), k.weights.data(), n_out, V, dlogits.data());
    ModelParams want = ModelParams::zeros(cfg), whole = ModelParams::zeros(cfg), chunked = ModelParams::zeros(cfg);
    for (ModelParams* g : {&want, &whole, &chunked}) std::fill(g->data(), g->data() + g->n_values(), std::nanf(""));
    ASSERT_TRUE(model->backward(ctx_, acts, dlogits.data(), want.spans(), nullptr, GradWrite::kOverwrite).ok());
    model->lm_head_backward(ctx_, acts.final_norm, n_out, dlogits.data(), dhidden.data(), whole.spans().output.data(),
                            GradWrite::kOverwrite);
    ASSERT_TRUE(model->backward(ctx_, acts, BackwardFrom::hidden(dhidden.data()), whole.spans(), nullptr,
                                GradWrite::kOverwrite).ok());
    const int64_t first = n_out / 2;  // rows [0, first), then [first, n_out)
    for (const auto& [r0, n, write] : {std::tuple{int64_t{0}, first, GradWrite::kOverwrite},
                                       std::tuple{first, n_out - first, GradWrite::kAdd}})
      model->lm_head_backward(ctx_, acts.final_norm + r0 * E, n, dlogits.data() + r0 * V, dhidden.data() + r0 * E,
                              chunked.spans().output.data(), write);
    ASSERT_TRUE(model->backward(ctx_, acts, BackwardFrom::hidden(dhidden.data()), chunked.spans(), nullptr,
                                GradWrite::kOverwrite).ok());
    for (size_t i = 0; i < want.tensors().size(); ++i) {
      const auto& w = want.tensors()[i];
      ASSERT_EQ(0, std::memcmp(w.data, whole.tensors()[i].data, w.size * sizeof(float))) << w.name;
      const double d = grad_rel_diff(chunked.tensors()[i].data, w.data, w.size);
      EXPECT_LE(d, 1e-6) << w.name << ": two chunks of the head's rows, |Δ|/|g| = " << d;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, GradParity, ::testing::Values(1, 2));

}  // namespace
}  // namespace dc
