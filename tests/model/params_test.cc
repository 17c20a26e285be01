// ModelParams: one contiguous f32 buffer with the tensors back to back in visit_weights order, and
// ModelWeights / ModelSpans views that are that buffer (no copies), also after a move.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/params.h"

namespace dc {
namespace {

ModelConfig small_config(bool tied) {
  ModelConfig c;
  c.n_vocab = 10, c.n_embd = 6, c.n_head = 3, c.n_head_kv = 1, c.head_dim = 2, c.n_ff = 7, c.n_layer = 2;
  c.tie_word_embeddings = tied;
  return c;
}

class ModelParamsLayout : public ::testing::TestWithParam<bool> {};

TEST_P(ModelParamsLayout, OneBufferWithTheTensorsInVisitOrder) {
  const ModelConfig c = small_config(GetParam());
  ModelParams p = ModelParams::zeros(c);
  std::vector<std::string> names;
  ModelWeights scratch;
  visit_weights(c, scratch, [&](const WeightSlot& slot) { names.push_back(slot.name); });
  ASSERT_EQ(p.tensors().size(), names.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 64, 0u) << "the buffer is 64-byte aligned";
  int64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const ModelParams::Tensor& t = p.tensors()[i];
    EXPECT_EQ(t.name, names[i]);
    EXPECT_EQ(t.offset, offset) << t.name << " follows the previous tensor with no gap";
    EXPECT_EQ(t.data, p.data() + t.offset) << t.name;
    offset += t.size;
  }
  EXPECT_EQ(offset, p.n_values());
  EXPECT_EQ(p.find("lm_head.weight") == nullptr, GetParam());
  for (int64_t i = 0; i < p.n_values(); ++i) ASSERT_EQ(p.data()[i], 0.0f) << "value " << i;
}

TEST_P(ModelParamsLayout, WeightsAndSpansViewTheBufferItself) {
  const ModelConfig c = small_config(GetParam());
  ModelParams p = ModelParams::zeros(c);
  const float* wq = p.find("model.layers.1.self_attn.q_proj.weight")->data;
  const float* bk = p.find("model.layers.1.self_attn.k_proj.bias")->data;
  const float* norm = p.find("model.norm.weight")->data;
  const float* embd = p.find("model.embed_tokens.weight")->data;
  const float* out = GetParam() ? embd : p.find("lm_head.weight")->data;
  // A write through the buffer is seen through both views: they are the same memory.
  for (int64_t i = 0; i < p.n_values(); ++i) p.data()[i] = static_cast<float>(i);
  ModelParams moved = std::move(p);  // the views survive a move
  const ModelWeights& w = moved.weights();
  const ModelSpans& s = moved.spans();
  EXPECT_EQ(w.layers[1].wq.data, wq);
  EXPECT_EQ(w.layers[1].wq.dtype, DType::kF32);
  EXPECT_EQ(w.layers[1].wq.rows, c.n_head * c.head_dim);
  EXPECT_EQ(w.layers[1].bk.data(), bk);
  EXPECT_EQ(w.output_norm.data(), norm);
  EXPECT_EQ(w.tok_embd.data, embd);
  EXPECT_EQ(w.output.data, out);
  EXPECT_EQ(s.layers[1].wq.data(), wq);
  EXPECT_EQ(s.layers[1].bk.data(), bk);
  EXPECT_EQ(s.output_norm.data(), norm);
  EXPECT_EQ(s.output.data(), out);
  EXPECT_EQ(s.layers[1].bk.size(), static_cast<size_t>(c.n_head_kv * c.head_dim));
  EXPECT_EQ(w.output_norm[3], static_cast<float>(norm - moved.data() + 3));
  s.output_norm[3] = -1.0f;
  EXPECT_EQ(w.output_norm[3], -1.0f);
  moved.zero();
  EXPECT_EQ(w.output_norm[3], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Embeddings, ModelParamsLayout, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

TEST(ModelParams, FromWeightsWidensToF32AndRefusesQuantizedMatrices) {
  const ModelConfig c = small_config(false);
  ModelParams src = ModelParams::zeros(c);
  for (int64_t i = 0; i < src.n_values(); ++i) src.data()[i] = 0.5f * static_cast<float>(i % 17) - 3.0f;
  // The same values as bf16 matrices (exact: multiples of 0.5 below 8) and f32 vectors.
  ModelWeights bf16 = src.weights();
  std::vector<std::vector<uint16_t>> store;
  visit_weights(c, bf16, [&](const WeightSlot& slot) {
    if (slot.matrix == nullptr) return;
    const WeightView f32 = *slot.matrix;
    store.emplace_back(f32.rows * f32.cols);
    for (int64_t k = 0; k < f32.rows * f32.cols; ++k) store.back()[k] = f32_to_bf16(static_cast<const float*>(f32.data)[k]);
    *slot.matrix = WeightView{DType::kBF16, store.back().data(), f32.rows, f32.cols};
  });
  auto copy = ModelParams::from_weights(c, bf16);
  ASSERT_TRUE(copy.ok()) << copy.status().message();
  ASSERT_EQ(copy->n_values(), src.n_values());
  EXPECT_NE(copy->data(), src.data());
  for (int64_t i = 0; i < src.n_values(); ++i) ASSERT_EQ(copy->data()[i], src.data()[i]) << "value " << i;
  bf16.layers[0].wv.quant = WeightQuant::kQ8;
  bf16.layers[0].wv.dtype = DType::kI8;
  auto refused = ModelParams::from_weights(c, bf16);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("model.layers.0.self_attn.v_proj.weight"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace dc
