// A --model path, directory or dream GGUF, read without an Engine (model_source.h).
#include "gguf/model_source.h"

#include <filesystem>

#include "gguf/dream.h"
#include "gguf/tokenizer_gguf.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"

namespace dc {

Result<ModelConfig> model_source_config(const std::string& path) {
  if (is_gguf_path(path)) {
    DC_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
    return dream_config(file);
  }
  DC_ASSIGN_OR_RETURN(const Checkpoint ckpt, Checkpoint::open(path));
  return ckpt.config();
}

Result<nlohmann::json> model_source_config_json(const std::string& path) {
  if (is_gguf_path(path)) {
    DC_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
    return dream_config_json(file);
  }
  const std::string config_path = (std::filesystem::path(path) / "config.json").string();
  DC_ASSIGN_OR_RETURN(const std::string text, read_text_file(config_path));
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) return parse_error(config_path + ": not a JSON object");
  return config;
}

Result<ModelParams> load_trainable_params(const std::string& path, ModelConfig* config) {
  if (!is_gguf_path(path)) {
    DC_ASSIGN_OR_RETURN(const Checkpoint ckpt, Checkpoint::open(path));
    *config = ckpt.config();
    return ModelParams::from_checkpoint(ckpt);
  }
  {  // refuse a quantized file before any work: its weights are not the model's to train
    DC_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(path));
    for (const GgufTensor& t : file.tensors()) {
      if (t.type == GgufType::kF32 || t.type == GgufType::kF16 || t.type == GgufType::kBF16) continue;
      return invalid_argument(path + ": tensor '" + t.name + "' is " +
                              gguf_type_info(static_cast<uint32_t>(t.type))->name +
                              "; training needs F32, F16 or BF16 weights (a quantized model's rounding would be "
                              "trained on). Train from the safetensors checkpoint directory, or a float GGUF "
                              "(`diffucoder convert --model DIR --out FILE.gguf --weights bf16`)");
    }
  }
  DC_ASSIGN_OR_RETURN(GgufModel m, load_gguf_model(path, nullptr));
  *config = m.config;
  return ModelParams::from_weights(m.config, m.weights);
}

Result<std::unique_ptr<Model>> load_model_source(const std::string& path, ThreadPool* pool) {
  if (!is_gguf_path(path)) return Model::load(path);
  DC_ASSIGN_OR_RETURN(GgufModel m, load_gguf_model(path, pool));
  return Model::from_weights(m.config, std::move(m.weights), std::move(m.storage));
}

Result<Tokenizer> model_source_tokenizer(const std::string& path) {
  return load_tokenizer_file(is_gguf_path(path) ? path : (std::filesystem::path(path) / "tokenizer.json").string());
}

}  // namespace dc
