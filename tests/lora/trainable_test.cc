// lora/trainable.h and the unmerged LoRA forward / backward (model/lora_project.h) against PyTorch autograd
// (tests/reference/make_grad_fixtures.py's LoRA cases: the masked-diffusion loss over a frozen tiny model
// with PEFT adapters, d loss / d A and B): the loss and every adapter gradient, f32; the unmerged forward's
// logits against the adapter merged into the weights; recomputation bit for bit; dropout's gradient against
// finite differences; a q8 base; PEFT's save / load round trip and initialisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fixtures.h"
#include "grad_case.h"
#include "io/safetensors.h"
#include "lora/adapter.h"
#include "lora/merge.h"
#include "lora/trainable.h"
#include "model/params.h"
#include "model/quantize.h"
#include "model/transformer.h"
#include "ops/loss.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
const fs::path kGradDir = DC_GRAD_FIXTURES_DIR;

nlohmann::json batch_case(const std::string& name) {
  for (const auto& c : testing::load_json((kGradDir / "grad_cases.json").string()))
    if (c["name"] == name) return c;
  return {};
}

// The loss of `batch` under `lora` and, with `grads`, its adapter gradients (added into them).
double lora_loss(const Context& ctx, const Model& model, const GradCase& k, const LoraWeights& lora,
                 LoraParams* grads, bool recompute = false) {
  const ForwardBatch fb = k.batch(&lora);
  const int64_t V = model.config().n_vocab;
  std::vector<float> logits(fb.n_out * V);
  Activations acts;
  acts.recompute = recompute;
  EXPECT_TRUE(model.forward(ctx, fb, logits.data(), nullptr, &acts).ok());
  const double loss = cross_entropy(ctx, logits.data(), k.targets.data(), k.weights.data(), fb.n_out, V, logits.data());
  if (grads != nullptr) {
    const Status s = model.backward_lora(ctx, acts, logits.data(), lora, grads->grads());
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return loss;
}

class LoraTrainable : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kGradDir / "lora" / "cases.json")) << "run `ctest -R grad_fixtures` first";
    auto loaded = Model::load((kGradDir / "tiny-train").string());
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    model_ = std::move(*loaded);
    pool_ = std::make_unique<ThreadPool>(2);
    ctx_.pool = pool_.get();
  }
  LoraParams open(const std::string& rel) {
    auto adapter = open_lora_adapter((kGradDir / rel).string());
    EXPECT_TRUE(adapter.ok()) << adapter.status().message();
    auto p = LoraParams::from_adapter(*adapter, model_->config());
    EXPECT_TRUE(p.ok()) << p.status().message();
    return std::move(*p);
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  Context ctx_;
};

TEST_F(LoraTrainable, LossAndAdapterGradientsMatchAutograd) {
  for (const auto& c : testing::load_json((kGradDir / "lora" / "cases.json").string())) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const GradCase k = make_grad_case(batch_case(name), static_cast<int32_t>(model_->config().mask_token_id));
    const LoraParams lora = open(c["adapter"]);
    LoraParams grads = LoraParams::zeros_like(lora);
    const double loss = lora_loss(ctx_, *model_, k, lora.weights(), &grads);
    EXPECT_NEAR(loss, c["loss"].get<double>(), 1e-5 * c["loss"].get<double>());
    auto ref = SafetensorsFile::open((kGradDir / "lora" / (name + ".grads.safetensors")).string());
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    ASSERT_EQ(ref->tensors().size(), grads.tensors().size());
    for (const auto& t : grads.tensors()) {
      const TensorInfo* r = ref->find(t.name);
      ASSERT_NE(r, nullptr) << t.name;
      ASSERT_EQ(r->shape, t.shape) << t.name;
      const double d = grad_rel_diff(grads.data() + t.offset, static_cast<const float*>(r->data), t.size);
      EXPECT_LE(d, 1e-4) << t.name << ": |Δ|/|autograd| = " << d;
    }
    // Gradient checkpointing: the same gradients, bit for bit.
    LoraParams again = LoraParams::zeros_like(lora);
    lora_loss(ctx_, *model_, k, lora.weights(), &again, /*recompute=*/true);
    ASSERT_EQ(0, std::memcmp(grads.data(), again.data(), grads.n_values() * sizeof(float)));
  }
}

TEST_F(LoraTrainable, UnmergedLogitsEqualTheMergedModels) {
  const auto c = testing::load_json((kGradDir / "lora" / "cases.json").string())[1];
  const LoraParams lora = open(c["adapter"]);
  auto base = Model::load((kGradDir / "tiny-train").string());
  ASSERT_TRUE(base.ok());
  auto merged = load_lora_merged(std::move(*base), (kGradDir / c["adapter"].get<std::string>()).string(), nullptr);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  const GradCase k = make_grad_case(batch_case(c["name"]), static_cast<int32_t>(model_->config().mask_token_id));
  const int64_t V = model_->config().n_vocab, n = static_cast<int64_t>(k.rows.size());
  std::vector<float> unmerged(n * V), want(n * V), plain(n * V);
  ASSERT_TRUE(model_->forward(ctx_, k.batch(&lora.weights()), unmerged.data()).ok());
  ASSERT_TRUE((*merged)->forward(ctx_, k.batch(nullptr), want.data()).ok());
  ASSERT_TRUE(model_->forward(ctx_, k.batch(nullptr), plain.data()).ok());
  EXPECT_LE(grad_rel_diff(unmerged.data(), want.data(), n * V), 1e-5);
  EXPECT_GT(grad_rel_diff(plain.data(), want.data(), n * V), 1e-2) << "the adapter changed nothing";
}

// Dropout: the gradient of the loss under a fixed mask key, against central differences of the same loss.
TEST_F(LoraTrainable, DropoutGradientsMatchFiniteDifferences) {
  const auto c = testing::load_json((kGradDir / "lora" / "cases.json").string())[0];
  LoraParams lora = open(c["adapter"]);
  const GradCase k = make_grad_case(batch_case(c["name"]), static_cast<int32_t>(model_->config().mask_token_id));
  LoraWeights w = lora.weights();
  w.dropout = 0.4f, w.dropout_key = 99;
  LoraParams grads = LoraParams::zeros_like(lora);
  const double base_loss = lora_loss(ctx_, *model_, k, w, &grads);
  LoraWeights off = lora.weights();
  EXPECT_NE(base_loss, lora_loss(ctx_, *model_, k, off, nullptr)) << "dropout changed nothing";
  int checked = 0;
  for (size_t ti = 0; ti < lora.tensors().size(); ti += 3) {  // A and B tensors of several layers
    const auto& t = lora.tensors()[ti];
    for (int64_t i : {int64_t{0}, t.size / 2, t.size - 1}) {
      float* v = lora.data() + t.offset + i;
      const float keep = *v, h = 1e-2f;
      *v = keep + h;
      const double up = lora_loss(ctx_, *model_, k, w, nullptr);
      *v = keep - h;
      const double down = lora_loss(ctx_, *model_, k, w, nullptr);
      *v = keep;
      const double numeric = (up - down) / (2.0 * h), analytic = grads.data()[t.offset + i];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << t.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 6);
}

// A q8 base (QLoRA): the adapters' gradients flow through the quantized matrices, near the f32 base's.
TEST_F(LoraTrainable, QuantizedBaseGradientsNearTheF32Ones) {
  const auto c = testing::load_json((kGradDir / "lora" / "cases.json").string())[1];
  const LoraParams lora = open(c["adapter"]);
  QuantizeOptions q;
  q.embeddings = false;
  auto quantized = quantize_weights(model_->config(), model_->weights(), q, ctx_.pool);
  ASSERT_TRUE(quantized.ok()) << quantized.status().message();
  const auto q8 = Model::from_weights(model_->config(), quantized->weights, quantized->storage);
  ASSERT_TRUE(q8->weights().layers[0].wq.quantized());
  const GradCase k = make_grad_case(batch_case(c["name"]), static_cast<int32_t>(model_->config().mask_token_id));
  LoraParams f32 = LoraParams::zeros_like(lora), q8_grads = LoraParams::zeros_like(lora);
  lora_loss(ctx_, *model_, k, lora.weights(), &f32);
  lora_loss(ctx_, *q8, k, lora.weights(), &q8_grads);
  // The q8 base's own error (x rounded to int8 per block too) on this tiny random model: measured 5.8 %.
  const double d = grad_rel_diff(q8_grads.data(), f32.data(), f32.n_values());
  EXPECT_LE(d, 0.15);
  EXPECT_GT(d, 0.0) << "the q8 base gave the f32 base's gradients: it was not read";
  // A full backward over quantized weights is refused (they cannot be trained).
  Activations acts;
  const ForwardBatch fb = k.batch(nullptr);
  std::vector<float> logits(fb.n_out * model_->config().n_vocab, 0.0f);
  ASSERT_TRUE(q8->forward(ctx_, fb, logits.data(), nullptr, &acts).ok());
  ModelParams grads = ModelParams::zeros(model_->config());
  const Status s = q8->backward(ctx_, acts, logits.data(), grads.spans());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("LoRA"), std::string::npos) << s.message();
}

TEST_F(LoraTrainable, PeftSaveLoadRoundTripsAndInitialisation) {
  LoraSpec spec;
  spec.r = 4, spec.alpha = 16, spec.dropout = 0.1f;
  ASSERT_TRUE(check_lora_spec(spec).ok());
  auto targets = parse_lora_targets("q,v_proj,down");
  ASSERT_TRUE(targets.ok());
  spec.targets = *targets;
  EXPECT_EQ(lora_targets_text(spec.targets), "q_proj,v_proj,down_proj");
  LoraParams p = LoraParams::zeros(model_->config(), spec);
  p.init_peft(7);
  ASSERT_EQ(p.tensors().size(), static_cast<size_t>(2 * 3 * model_->config().n_layer));
  for (size_t i = 0; i < p.tensors().size(); ++i) {
    const auto& t = p.tensors()[i];
    const float* d = p.data() + t.offset;
    const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
    float largest = 0;
    for (int64_t j = 0; j < t.size; ++j) largest = std::max(largest, std::fabs(d[j]));
    if (i % 2 == 1) EXPECT_EQ(largest, 0.0f) << t.name << ": B starts at zero";
    else EXPECT_TRUE(largest > 0.5f * bound && largest <= bound) << t.name << " " << largest;
  }
  LoraParams same = LoraParams::zeros(model_->config(), spec);
  same.init_peft(7);
  EXPECT_EQ(0, std::memcmp(p.data(), same.data(), p.n_values() * sizeof(float)));
  for (int64_t i = 0; i < p.n_values(); ++i) p.data()[i] += 0.001f * static_cast<float>(i % 7);  // B non-zero
  test::TempDir dir("lora_save");
  ASSERT_TRUE(p.save_peft(dir.path(), "tiny-train").ok());
  auto adapter = open_lora_adapter(dir.path());
  ASSERT_TRUE(adapter.ok()) << adapter.status().message();
  EXPECT_EQ(adapter->config.r, 4);
  EXPECT_DOUBLE_EQ(adapter->config.lora_alpha, 16.0);
  auto back = LoraParams::from_adapter(*adapter, model_->config());
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->n_values(), p.n_values());
  EXPECT_EQ(0, std::memcmp(back->data(), p.data(), p.n_values() * sizeof(float)));
  EXPECT_FLOAT_EQ(back->weights().layers[1][kLoraDown].scale, 4.0f);
  EXPECT_TRUE(back->weights().layers[1][kLoraK].empty());
  // Bad specs name the flag.
  EXPECT_NE(parse_lora_targets("q,qkv").status().message().find("qkv"), std::string::npos);
  LoraSpec bad = spec;
  bad.dropout = 1.0f;
  EXPECT_NE(check_lora_spec(bad).message().find("--lora-dropout"), std::string::npos);
}

}  // namespace
}  // namespace dc
