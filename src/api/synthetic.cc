// SyntheticModel → a named shape's config and random weights (model/synthetic.h), for the facade's Model and
// Trainer.
#include "api/synthetic.h"

#include "model/quantize.h"
#include "model/synthetic.h"
#include "model/weights.h"

namespace dc::api {

Result<ModelConfig> synthetic_config(const diffucoder::SyntheticModel& s) {
  if (s.layers < 0 || s.layers > 1024)
    return invalid_argument("synthetic.layers: must be 0 (the shape's) or in [1, 1024], got " + std::to_string(s.layers));
  if (s.vocab < 0 || (s.vocab > 0 && s.vocab < 16) || s.vocab > (int64_t{1} << 20))
    return invalid_argument("synthetic.vocab: must be 0 (the shape's) or in [16, 1048576], got " + std::to_string(s.vocab));
  if (s.weights != "bf16" && s.weights != "q8" && s.weights != "q4")
    return invalid_argument("synthetic.weights: '" + s.weights + "' is not one of bf16, q8, q4");
  DC_ASSIGN_OR_RETURN(ModelConfig config, dc::synthetic_config(s.shape));
  if (s.layers > 0) config.n_layer = s.layers;
  if (s.vocab > 0) {
    config.n_vocab = s.vocab, config.mask_token_id = s.vocab - 2;
    config.pad_token_id = config.eos_token_id = config.bos_token_id = s.vocab - 1;
  }
  return config;
}

Result<std::unique_ptr<Model>> synthetic_model(const diffucoder::SyntheticModel& s, const ModelConfig& config,
                                               ThreadPool* pool) {
  if (s.weights == "bf16") return make_synthetic_model(config, s.seed, pool);
  QuantizeOptions q;
  q.format = s.weights == "q8" ? WeightQuant::kQ8 : WeightQuant::kQ4;
  q.group_size = s.group_size;
  return make_synthetic_model(config, s.seed, pool, &q);
}

int64_t count_values(const ModelConfig& config) {
  ModelWeights shapes;  // only sized: visit_tensors reads the shapes from the config
  int64_t n = 0;
  visit_tensors(config, shapes, [&](const std::string&, const std::vector<int64_t>& shape, const WeightView*,
                                    const VectorView*) {
    int64_t values = 1;
    for (int64_t d : shape) values *= d;
    n += values;
  });
  return n;
}

}  // namespace dc::api
