// Helpers of the GGUF model tests: logits of a model, a GGUF loaded as a Model, a tiny dense checkpoint
// directory written from random weights, the largest logit error relative to the logits' range, and the
// tiny-vocab fixture as a GGUF file.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "../batch_case.h"
#include "../fixtures.h"
#include "gguf/dream.h"
#include "gguf/writer.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "model/weights.h"

namespace dc::test {

inline ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// The tiny-vocab fixture as a GGUF file of `weights`, kBF16 or kQ8_0 (the two the gguf_source_* setup tests of
// tests/CMakeLists.txt write). Under ctest, theirs (converted by the CLI once per run, before the test processes,
// in the folder DC_GGUF_SOURCE_DIR names); run alone, converted into `dir`. Fails the test (empty path) when
// neither works.
inline std::string tiny_vocab_gguf(GgufWeights weights, const std::string& dir) {
  if (weights != GgufWeights::kBF16 && weights != GgufWeights::kQ8_0) {
    ADD_FAILURE() << "tiny_vocab_gguf: only BF16 and Q8_0 files are made";
    return "";
  }
  const std::string name = weights == GgufWeights::kBF16 ? "bf16" : "q8_0";
  const char* ctest_dir = std::getenv("DC_GGUF_SOURCE_DIR");
  const std::string path = (std::filesystem::path(ctest_dir != nullptr ? ctest_dir : dir) / ("tiny-vocab-" + name + ".gguf")).string();
  if (ctest_dir != nullptr) {
    if (std::filesystem::exists(path)) return path;
    ADD_FAILURE() << path << ": ctest's gguf_source setup tests should have written it";
    return "";
  }
  GgufConvertOptions o;
  o.model_dir = testing::fixtures_dir() + "/tiny-vocab";
  o.out_path = path;
  o.weights = weights;
  const Status s = convert_to_gguf(o, &pool());
  if (s.ok()) return path;
  ADD_FAILURE() << s.to_string();
  return "";
}

// The logits of every position of one fixed sequence of 7 tokens, at f32 precision (with the reference
// kernels when asked).
inline std::vector<float> logits_of(const Model& m, bool reference_kernels = false) {
  const int64_t n_vocab = m.config().n_vocab;
  BatchCase k = every_position(1, 7, [&](int64_t i) { return (i * 37 + 5) % n_vocab; });
  k.tokens[3] = static_cast<int32_t>(m.config().mask_token_id);
  Context ctx{Device::kCpu, &pool()};
  ctx.matmul_precision = MatmulPrecision::kF32;
  ctx.reference_kernels = reference_kernels;
  std::vector<float> logits(k.rows.size() * static_cast<size_t>(n_vocab));
  const Status s = m.forward(ctx, k.view(), logits.data());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

inline Result<std::unique_ptr<Model>> load_gguf(const std::string& path) {
  DC_ASSIGN_OR_RETURN(GgufModel g, load_gguf_model(path, &pool()));
  return Model::from_weights(std::move(g.config), std::move(g.weights), std::move(g.storage));
}

// max |a − b| / max |b|.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, range = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    range = std::max(range, static_cast<double>(std::fabs(b[i])));
  }
  return diff / range;
}

// A tiny Dream config whose matrices have 256 / 512 columns (the K-quants' 256-value blocks).
inline ModelConfig wide_config() {
  ModelConfig c;
  c.torch_dtype = "float32";
  c.n_vocab = 320;
  c.n_embd = 256;
  c.n_ff = 512;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 512;
  c.rope_theta = 10000.0;
  c.mask_token_id = 319;
  c.pad_token_id = 318;
  c.bos_token_id = 317;
  c.eos_token_id = 318;
  return c;
}

// Writes `c` as config.json and random f32 weights (matrices ~ U(−0.1, 0.1), norms ~ 1) as
// model.safetensors into `dir`.
inline void write_dense_checkpoint(const std::string& dir, const ModelConfig& c, uint64_t seed) {
  std::filesystem::create_directories(dir);
  nlohmann::json j = {{"architectures", {"DreamModel"}}, {"model_type", "Dream"}, {"torch_dtype", "float32"},
                      {"vocab_size", c.n_vocab}, {"hidden_size", c.n_embd}, {"intermediate_size", c.n_ff},
                      {"num_hidden_layers", c.n_layer}, {"num_attention_heads", c.n_head},
                      {"num_key_value_heads", c.n_head_kv}, {"max_position_embeddings", c.max_position_embeddings},
                      {"rope_theta", c.rope_theta}, {"rms_norm_eps", c.rms_norm_eps}, {"tie_word_embeddings", false},
                      {"mask_token_id", c.mask_token_id}, {"pad_token_id", c.pad_token_id},
                      {"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id}};
  ASSERT_TRUE(write_text_file(dir + "/config.json", j.dump()).ok());
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  ModelWeights shapes;
  uint64_t k = seed << 32;
  visit_weights(c, shapes, [&](const WeightSlot& slot) {
    int64_t n = 1;
    for (int64_t d : slot.shape) n *= d;
    std::vector<float>& v = values.emplace_back(static_cast<size_t>(n));
    const bool norm = slot.name.find("norm") != std::string::npos;
    for (float& x : v) {
      const float u = static_cast<float>(splitmix64(k++) >> 40) / 16777216.0f - 0.5f;
      x = norm ? 1.0f + 0.2f * u : 0.2f * u;
    }
  });
  size_t i = 0;
  visit_weights(c, shapes, [&](const WeightSlot& slot) {
    tensors.push_back({slot.name, DType::kF32, slot.shape, values[i++].data()});
  });
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).ok());
}

}  // namespace dc::test
