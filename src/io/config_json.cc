// config.json / generation_config.json: typed field readers whose errors name the field and the
// file, then the architecture validation of ModelConfig.
#include "io/config_json.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/number_text.h"
#include "io/mapped_file.h"

namespace dc {
namespace {

using Json = nlohmann::json;

// Reads typed fields of one JSON object; every error names `path` and the field.
class FieldReader {
 public:
  FieldReader(const Json& root, const std::string& path) : root_(root), path_(path) {}

  const Json* find(const char* key) const {
    auto it = root_.find(key);
    return it == root_.end() ? nullptr : &*it;
  }

  Status type_error(const char* key, const char* expected, const Json& got) const {
    std::string shown = got.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    return invalid_argument(path_ + ": field \"" + key + "\" must be " + expected + ", got " + got.type_name() +
                            " " + shown + "; fix the file");
  }

  Status value_error(const char* key, const std::string& problem) const {
    return invalid_argument(path_ + ": field \"" + key + "\" " + problem);
  }

  // Valid input asking for a feature the engine does not implement.
  Status unsupported(const char* key, const std::string& problem) const {
    return unimplemented(path_ + ": field \"" + key + "\" " + problem);
  }

  // An integer field; absent leaves *out. With `null_value`, null stores it; otherwise null is an error.
  Status get_int(const char* key, int64_t* out, const int64_t* null_value = nullptr) const {
    const Json* j = find(key);
    if (j == nullptr) return Status::ok_status();
    if (j->is_null() && null_value != nullptr) {
      *out = *null_value;
      return Status::ok_status();
    }
    return to_int(key, *j, out);
  }

  // A token id: integer, null (-> -1) or a list of integers (-> the first, -1 when empty).
  Status get_token_id(const char* key, int64_t* out) const {
    const Json* j = find(key);
    if (j == nullptr) return Status::ok_status();
    if (j->is_null() || (j->is_array() && j->empty())) {
      *out = -1;
      return Status::ok_status();
    }
    if (j->is_array()) {
      for (const Json& e : *j) {
        if (!e.is_number_integer()) return type_error(key, "an integer, null or a list of integers", *j);
      }
      return to_int(key, j->front(), out);
    }
    if (!j->is_number_integer()) return type_error(key, "an integer, null or a list of integers", *j);
    return to_int(key, *j, out);
  }

  // A number (integer or floating point); null stores `null_value` when given.
  Status get_double(const char* key, double* out, const double* null_value = nullptr) const {
    const Json* j = find(key);
    if (j == nullptr) return Status::ok_status();
    if (j->is_null() && null_value != nullptr) {
      *out = *null_value;
      return Status::ok_status();
    }
    if (!j->is_number()) return type_error(key, "a number", *j);
    *out = j->get<double>();
    return Status::ok_status();
  }

  Status get_bool(const char* key, bool* out) const {
    const Json* j = find(key);
    if (j == nullptr) return Status::ok_status();
    if (!j->is_boolean()) return type_error(key, "true or false", *j);
    *out = j->get<bool>();
    return Status::ok_status();
  }

  // A string field; null leaves *out when `allow_null`.
  Status get_string(const char* key, std::string* out, bool allow_null = false) const {
    const Json* j = find(key);
    if (j == nullptr || (allow_null && j->is_null())) return Status::ok_status();
    if (!j->is_string()) return type_error(key, allow_null ? "a string or null" : "a string", *j);
    *out = j->get<std::string>();
    return Status::ok_status();
  }

 private:
  Status to_int(const char* key, const Json& j, int64_t* out) const {
    if (!j.is_number_integer()) return type_error(key, "an integer", j);
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return value_error(key, "is too large for a 64-bit integer");
    }
    *out = j.get<int64_t>();
    return Status::ok_status();
  }

  const Json& root_;
  const std::string& path_;
};

Status parse_object(std::string_view text, const std::string& path, Json* out) {
  // nlohmann's parser ends the input at a NUL byte: refuse it rather than ignore what follows.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return parse_error(path + ": not valid JSON (a NUL byte at byte " + std::to_string(nul) + ")");
  }
  try {
    *out = Json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return parse_error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!out->is_object()) {
    return parse_error(path + ": must hold a JSON object {...}, got " + std::string(out->type_name()));
  }
  return Status::ok_status();
}

// Fields the engine does not store but must refuse when they ask for something it does not implement.
Status check_unsupported_features(const FieldReader& r) {
  if (const Json* j = r.find("rope_scaling"); j != nullptr && !j->is_null()) {
    if (!j->is_object()) return r.type_error("rope_scaling", "null or an object", *j);
    const Json* type = nullptr;
    if (auto it = j->find("rope_type"); it != j->end()) type = &*it;
    else if (auto it2 = j->find("type"); it2 != j->end()) type = &*it2;
    if (type == nullptr || !type->is_string()) {
      return r.value_error("rope_scaling", "must have a string \"rope_type\" (or \"type\")");
    }
    if (type->get<std::string>() != "default") {
      return r.unsupported("rope_scaling", "has type \"" + type->get<std::string>() +
                                               "\", which is not supported (only null or \"default\" RoPE)");
    }
  }
  bool flag = false;
  DC_RETURN_IF_ERROR(r.get_bool("use_sliding_window", &flag));
  if (flag) return r.unsupported("use_sliding_window", "is true: sliding-window attention is not supported");
  flag = false;
  DC_RETURN_IF_ERROR(r.get_bool("use_mrope", &flag));
  if (flag) return r.unsupported("use_mrope", "is true: multimodal RoPE is not supported");
  int64_t ignored_int = 0;
  const int64_t kNull = -1;
  DC_RETURN_IF_ERROR(r.get_int("sliding_window", &ignored_int, &kNull));
  double ignored_double = 0;
  DC_RETURN_IF_ERROR(r.get_double("attention_dropout", &ignored_double));
  if (const Json* j = r.find("architectures"); j != nullptr && !j->is_null()) {
    const bool ok = j->is_array() && std::all_of(j->begin(), j->end(), [](const Json& e) { return e.is_string(); });
    if (!ok) return r.type_error("architectures", "a list of strings", *j);
  }
  return Status::ok_status();
}

Status check_token_id(const FieldReader& r, const char* key, int64_t id, int64_t n_vocab) {
  if (id < -1 || id >= n_vocab) {
    return r.value_error(key, "is " + std::to_string(id) + ", outside [0, vocab_size = " + std::to_string(n_vocab) +
                                  "); use null for none");
  }
  return Status::ok_status();
}

// `v` for a message, marked when the field is absent from the file (the value is then the default).
std::string shown(const FieldReader& r, const char* key, int64_t v) {
  return std::to_string(v) + (r.find(key) == nullptr ? " (absent from the file: the default)" : "");
}

Status validate(const FieldReader& r, const ModelConfig& c) {
  struct Size {
    const char* key;
    int64_t value, limit;
  };
  const Size sizes[] = {{"vocab_size", c.n_vocab, kMaxConfigVocab},
                        {"hidden_size", c.n_embd, kMaxConfigHidden},
                        {"intermediate_size", c.n_ff, kMaxConfigIntermediate},
                        {"num_hidden_layers", c.n_layer, kMaxConfigLayers},
                        {"num_attention_heads", c.n_head, kMaxConfigHeads},
                        {"num_key_value_heads", c.n_head_kv, kMaxConfigHeads},
                        {"head_dim", c.head_dim, kMaxConfigHeadDim},
                        {"max_position_embeddings", c.max_position_embeddings, kMaxConfigContext}};
  for (const Size& z : sizes) {
    if (z.value <= 0) return r.value_error(z.key, "must be positive, got " + shown(r, z.key, z.value));
    if (z.value > z.limit) {
      return r.value_error(z.key, "is " + std::to_string(z.value) + ", more than this engine's limit of " +
                                      std::to_string(z.limit) + "; fix the file");
    }
  }
  if (c.n_head % c.n_head_kv != 0) {
    return r.value_error("num_key_value_heads", "is " + shown(r, "num_key_value_heads", c.n_head_kv) +
                                                    " and must divide num_attention_heads, " +
                                                    shown(r, "num_attention_heads", c.n_head));
  }
  if (c.head_dim % 2 != 0) {
    return r.value_error("head_dim", "must be even for rotary embeddings, got " + std::to_string(c.head_dim));
  }
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return r.value_error("rms_norm_eps", "must be a finite number > 0, got " + number_text(c.rms_norm_eps));
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return r.value_error("rope_theta", "must be a finite number > 0, got " + number_text(c.rope_theta));
  }
  DC_RETURN_IF_ERROR(check_token_id(r, "mask_token_id", c.mask_token_id, c.n_vocab));
  DC_RETURN_IF_ERROR(check_token_id(r, "pad_token_id", c.pad_token_id, c.n_vocab));
  DC_RETURN_IF_ERROR(check_token_id(r, "bos_token_id", c.bos_token_id, c.n_vocab));
  DC_RETURN_IF_ERROR(check_token_id(r, "eos_token_id", c.eos_token_id, c.n_vocab));
  return Status::ok_status();
}

Status fill_model_config(const FieldReader& r, ModelConfig* c) {
  DC_RETURN_IF_ERROR(r.get_string("model_type", &c->model_type));
  if (c->model_type != "Dream" && c->model_type != "dream" && c->model_type != "qwen2") {
    return r.unsupported("model_type", "is \"" + c->model_type +
                                           "\"; only \"Dream\" (DiffuCoder, Dream) and \"qwen2\" checkpoints are supported");
  }
  DC_RETURN_IF_ERROR(r.get_string("torch_dtype", &c->torch_dtype, /*allow_null=*/true));
  if (r.find("torch_dtype") == nullptr) DC_RETURN_IF_ERROR(r.get_string("dtype", &c->torch_dtype, true));
  {
    const char* key = r.find("torch_dtype") != nullptr ? "torch_dtype" : "dtype";
    const std::string& d = c->torch_dtype;
    if (d != "bfloat16" && d != "float16" && d != "float32" && d != "float" && d != "half" && d != "auto")
      return r.value_error(key, "is \"" + d + "\"; expected bfloat16, float16 or float32");
  }
  DC_RETURN_IF_ERROR(r.get_string("hidden_act", &c->hidden_act));
  if (c->hidden_act != "silu") {
    return r.unsupported("hidden_act", "is \"" + c->hidden_act + "\"; only \"silu\" is supported");
  }
  DC_RETURN_IF_ERROR(r.get_int("vocab_size", &c->n_vocab));
  DC_RETURN_IF_ERROR(r.get_int("hidden_size", &c->n_embd));
  DC_RETURN_IF_ERROR(r.get_int("intermediate_size", &c->n_ff));
  DC_RETURN_IF_ERROR(r.get_int("num_hidden_layers", &c->n_layer));
  DC_RETURN_IF_ERROR(r.get_int("num_attention_heads", &c->n_head));
  const int64_t n_head = c->n_head;  // Qwen2Config: num_key_value_heads null -> num_attention_heads
  DC_RETURN_IF_ERROR(r.get_int("num_key_value_heads", &c->n_head_kv, &n_head));
  if (const Json* j = r.find("head_dim"); j != nullptr && !j->is_null()) {
    DC_RETURN_IF_ERROR(r.get_int("head_dim", &c->head_dim));  // validate() checks it is positive
  } else {
    if (c->n_head <= 0) {
      return r.value_error("num_attention_heads", "must be positive, got " + std::to_string(c->n_head));
    }
    if (c->n_embd % c->n_head != 0) {
      return r.value_error("hidden_size", "(" + std::to_string(c->n_embd) +
                                              ") must be divisible by num_attention_heads (" +
                                              std::to_string(c->n_head) + ") when head_dim is not given");
    }
    c->head_dim = c->n_embd / c->n_head;
  }
  DC_RETURN_IF_ERROR(r.get_int("max_position_embeddings", &c->max_position_embeddings));
  DC_RETURN_IF_ERROR(r.get_double("rope_theta", &c->rope_theta));
  DC_RETURN_IF_ERROR(r.get_double("rms_norm_eps", &c->rms_norm_eps));
  DC_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c->tie_word_embeddings));
  DC_RETURN_IF_ERROR(r.get_token_id("mask_token_id", &c->mask_token_id));
  DC_RETURN_IF_ERROR(r.get_token_id("pad_token_id", &c->pad_token_id));
  DC_RETURN_IF_ERROR(r.get_token_id("bos_token_id", &c->bos_token_id));
  DC_RETURN_IF_ERROR(r.get_token_id("eos_token_id", &c->eos_token_id));
  DC_RETURN_IF_ERROR(check_unsupported_features(r));
  return validate(r, *c);
}

// The "quantization" object of a config.json object (absent or null: format kNone).
Status read_quantization(const Json& j, const std::string& path, QuantizationConfig* out) {
  QuantizationConfig q;
  auto it = j.find("quantization");
  if (it == j.end() || it->is_null()) {
    *out = q;
    return Status::ok_status();
  }
  const std::string where = path + ": \"quantization\"";
  if (!it->is_object())
    return parse_error(where + " must be an object {\"format\": \"q8\" | \"q4\", \"group_size\": N}");
  auto format = it->find("format");
  if (format == it->end() || !format->is_string())
    return parse_error(where + ".format must be the string \"q8\" or \"q4\"");
  if (*format == "q8") {
    q.format = WeightQuant::kQ8;
  } else if (*format == "q4") {
    q.format = WeightQuant::kQ4;
  } else {
    return unimplemented(where + ".format is \"" + format->get<std::string>() +
                         "\"; this engine reads \"q8\" and \"q4\" (written by `diffucoder convert`)");
  }
  auto group = it->find("group_size");
  if (q.format == WeightQuant::kQ4) {
    if (group == it->end() || !group->is_number_integer() || group->get<int64_t>() < 2 || group->get<int64_t>() % 2)
      return parse_error(where + ".group_size must be an even integer >= 2 for q4");
    q.group_size = group->get<int64_t>();
  } else if (group != it->end() && !group->is_null() && !(group->is_number_integer() && group->get<int64_t>() == 0)) {
    return parse_error(where + ".group_size must be 0 (one scale per row) for q8");
  }
  *out = q;
  return Status::ok_status();
}

}  // namespace

Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& path) {
  Json root;
  DC_RETURN_IF_ERROR(parse_object(json_text, path, &root));
  FieldReader reader(root, path);
  ModelConfig config;
  DC_RETURN_IF_ERROR(fill_model_config(reader, &config));
  DC_RETURN_IF_ERROR(read_quantization(root, path, &config.quantization));
  return config;
}

Result<QuantizationConfig> parse_quantization_config(std::string_view json_text, const std::string& path) {
  Json root;
  DC_RETURN_IF_ERROR(parse_object(json_text, path, &root));
  QuantizationConfig q;
  DC_RETURN_IF_ERROR(read_quantization(root, path, &q));
  return q;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  DC_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_model_config(text, path);
}

Result<GenerationConfigFile> parse_generation_config(std::string_view json_text, const std::string& path) {
  Json root;
  DC_RETURN_IF_ERROR(parse_object(json_text, path, &root));
  FieldReader r(root, path);
  GenerationConfigFile g;
  g.present = true;
  const double kUnsetDouble = -1;
  const int64_t kUnsetInt = -1;
  DC_RETURN_IF_ERROR(r.get_string("alg", &g.alg, /*allow_null=*/true));
  const std::pair<const char*, double*> doubles[] = {
      {"temperature", &g.temperature}, {"top_p", &g.top_p}, {"eps", &g.eps}, {"alg_temp", &g.alg_temp}};
  for (const auto& [key, out] : doubles) {
    DC_RETURN_IF_ERROR(r.get_double(key, out, &kUnsetDouble));
    if (r.find(key) != nullptr && !r.find(key)->is_null() && !(*out >= 0)) {
      return r.value_error(key, "must be >= 0 or null, got " + number_text(*out));
    }
  }
  if (g.top_p > 1) return r.value_error("top_p", "must be in [0, 1] or null, got " + number_text(g.top_p));
  const std::pair<const char*, int64_t*> ints[] = {
      {"top_k", &g.top_k}, {"steps", &g.steps}, {"max_new_tokens", &g.max_new_tokens}, {"max_length", &g.max_length}};
  for (const auto& [key, out] : ints) {
    DC_RETURN_IF_ERROR(r.get_int(key, out, &kUnsetInt));
    if (r.find(key) != nullptr && !r.find(key)->is_null() && *out < 0) {
      return r.value_error(key, "must be >= 0 or null, got " + std::to_string(*out));
    }
  }
  const std::pair<const char*, int64_t*> ids[] = {{"mask_token_id", &g.mask_token_id},
                                                  {"pad_token_id", &g.pad_token_id},
                                                  {"bos_token_id", &g.bos_token_id},
                                                  {"eos_token_id", &g.eos_token_id}};
  for (const auto& [key, out] : ids) {
    DC_RETURN_IF_ERROR(r.get_token_id(key, out));
    if (*out < -1) return r.value_error(key, "must be a token id >= 0 or null, got " + std::to_string(*out));
  }
  return g;
}

Result<GenerationConfigFile> load_generation_config(const std::string& path) {
  DC_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_generation_config(text, path);
}

}  // namespace dc
