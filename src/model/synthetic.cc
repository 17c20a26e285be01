// Synthetic models: shapes by name and random bf16 weights generated with a counter-based hash
// (each element a function of (seed, tensor, index), so the fill is parallel and reproducible).
#include "model/synthetic.h"

#include <cmath>

#include "core/splitmix64.h"

namespace dc {
namespace {

// Uniform in [-a, a) with a = std·√3.
float uniform(uint64_t key, float stddev) {
  const float u = static_cast<float>(splitmix64(key) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * u - 1.0f) * stddev * 1.7320508f;
}

struct SyntheticStorage {
  explicit SyntheticStorage(const ModelConfig& config) : vectors(config) {}
  VectorStore vectors;
  std::vector<std::unique_ptr<uint16_t[]>> matrices;
  std::vector<QuantizedMatrix> quantized;
};

}  // namespace

std::vector<std::string> synthetic_shape_names() { return {"diffucoder-7b", "qwen2.5-0.5b", "tiny"}; }

Result<ModelConfig> synthetic_config(const std::string& shape) {
  ModelConfig c;
  c.max_position_embeddings = 131072;
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.torch_dtype = "bfloat16";
  if (shape == "diffucoder-7b") {
    c.n_vocab = 152064; c.n_embd = 3584; c.n_ff = 18944; c.n_layer = 28; c.n_head = 28; c.n_head_kv = 4;
  } else if (shape == "qwen2.5-0.5b") {
    c.n_vocab = 151936; c.n_embd = 896; c.n_ff = 4864; c.n_layer = 24; c.n_head = 14; c.n_head_kv = 2;
  } else if (shape == "tiny") {
    c.n_vocab = 4096; c.n_embd = 64; c.n_ff = 128; c.n_layer = 2; c.n_head = 4; c.n_head_kv = 2;
    c.mask_token_id = 4094; c.pad_token_id = c.eos_token_id = c.bos_token_id = 4095;
  } else {
    std::string names;
    for (const auto& n : synthetic_shape_names()) names += (names.empty() ? "" : ", ") + n;
    return invalid_argument("--shape '" + shape + "' is not a known shape (" + names + ")");
  }
  c.head_dim = c.n_embd / c.n_head;
  return c;
}

Result<std::unique_ptr<Model>> make_synthetic_model(const ModelConfig& config, uint64_t seed, ThreadPool* pool,
                                                    const QuantizeOptions* quantize) {
  if (quantize != nullptr) DC_RETURN_IF_ERROR(check_quantize_options(*quantize));
  auto storage = std::make_shared<SyntheticStorage>(config);
  ModelWeights weights;
  uint64_t tensor_index = 0;
  Status status;
  visit_weights(config, weights, [&](const WeightSlot& slot) {
    if (!status.ok()) return;
    const uint64_t tensor_key = splitmix64(seed ^ (++tensor_index << 32));
    if (slot.vector != nullptr) {  // norms: 1; biases: small
      const bool is_norm = slot.name.find("norm") != std::string::npos;
      const std::span<float> v = storage->vectors.take(slot.shape[0]);
      for (int64_t i = 0; i < slot.shape[0]; ++i) v[i] = is_norm ? 1.0f : uniform(tensor_key + i, 0.02f);
      *slot.vector = v;
      return;
    }
    const int64_t rows = slot.shape[0], cols = slot.shape[1];
    auto data = std::unique_ptr<uint16_t[]>(new uint16_t[rows * cols]);
    uint16_t* p = data.get();
    parallel_for(pool, rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t j = 0; j < cols; ++j)
          p[r * cols + j] = f32_to_bf16(uniform(tensor_key + static_cast<uint64_t>(r * cols + j), 0.02f));
    }, 64);
    *slot.matrix = WeightView{DType::kBF16, p, rows, cols};
    if (quantize != nullptr && should_quantize(slot.name, cols, *quantize)) {
      auto q = quantize_matrix(*slot.matrix, *quantize, slot.name, pool);
      if (!q.ok()) {
        status = q.status();
        return;
      }
      storage->quantized.push_back(std::move(*q));
      *slot.matrix = storage->quantized.back().view;  // the view survives the vector's moves
      return;
    }
    storage->matrices.push_back(std::move(data));
  });
  DC_RETURN_IF_ERROR(status);
  if (config.tie_word_embeddings) weights.output = weights.tok_embd;
  return Model::from_weights(config, std::move(weights), std::move(storage));
}

}  // namespace dc
