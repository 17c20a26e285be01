// PEFT adapter_config.json parsing, adapter_model.safetensors opening, and the plan of a merge: which
// tensor changes which matrix of the model, checked against target_modules and the model's shapes.
#include "lora/adapter.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <type_traits>

#include "io/mapped_file.h"
#include "model/weights.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // rank_pattern / alpha_pattern: the first matching key in file order

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Status field_error(const std::string& path, const std::string& field, const std::string& what) {
  return invalid_argument(path + ": field '" + field + "' " + what);
}

// Fields that only shape training or initialisation: read past whatever they hold.
const std::set<std::string> kIgnored = {
    "base_model_name_or_path", "revision", "task_type", "inference_mode", "init_lora_weights",
    "auto_mapping", "loftq_config", "eva_config", "corda_config", "megatron_config", "megatron_core",
    "peft_version", "qalora_group_size", "layers_pattern"};

// A value that leaves a feature off: null, false, "", [] or {}.
bool is_off(const Json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
         ((v.is_array() || v.is_object()) && v.empty());
}

Result<std::vector<std::string>> string_list(const Json& v, const std::string& path, const std::string& field) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (!v.is_array()) return field_error(path, field, "must be a list of module names or null");
  for (const Json& e : v) {
    if (!e.is_string()) return field_error(path, field, "must hold strings, found " + e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

Status parse_targets(const Json& v, const std::string& path, LoraConfig& c) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "all-linear") {
      c.all_linear = true;
      return Status();
    }
    try {
      std::regex check(s);
    } catch (const std::regex_error& e) {
      return field_error(path, "target_modules", "'" + s + "' is not a valid regular expression (" + e.what() + ")");
    }
    c.target_regex = s;
    return Status();
  }
  if (!v.is_array() || v.empty())
    return field_error(path, "target_modules", "must be a non-empty list of module names or a regex string (got " +
                                                   v.dump() + ")");
  DC_ASSIGN_OR_RETURN(c.target_list, string_list(v, path, "target_modules"));
  return Status();
}

template <class T>
Status parse_pattern(const Json& v, const std::string& path, const std::string& field,
                     std::vector<std::pair<std::string, T>>* out) {
  if (v.is_null()) return Status();
  if (!v.is_object()) return field_error(path, field, "must be an object {module pattern: value}");
  for (const auto& item : v.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    const double number = value.is_number() ? value.template get<double>() : 0.0;
    if (!value.is_number() || !std::isfinite(number) || number <= 0)
      return field_error(path, field + "." + key, "must be a positive number (got " + value.dump() + ")");
    if constexpr (std::is_integral_v<T>) {
      if (!value.is_number_integer()) return field_error(path, field + "." + key, "must be an integer rank");
    }
    try {
      std::regex check("(.*\\.)?" + key);
    } catch (const std::regex_error& e) {
      return field_error(path, field, "key '" + key + "' is not a valid regular expression (" + e.what() + ")");
    }
    out->emplace_back(key, value.template get<T>());
  }
  return Status();
}

Status parse_fields(const Json& j, const std::string& path, LoraConfig& c) {
  bool have_targets = false;
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const Json& v = item.value();
    auto must_be = [&](bool ok, const std::string& what) {
      return ok ? Status() : field_error(path, key, what + " (got " + v.dump() + ")");
    };
    if (kIgnored.count(key)) {
      if (key == "layers_pattern" && !v.is_null() && v != Json("layers") && v != Json::array({"layers"}))
        return field_error(path, key, "must be null or \"layers\" (the model's layer list is model.layers)");
      continue;
    }
    if (key == "peft_type") {
      DC_RETURN_IF_ERROR(must_be(v == Json("LORA"), "must be \"LORA\": only LoRA adapters are supported"));
    } else if (key == "r") {
      DC_RETURN_IF_ERROR(must_be(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= 65536,
                                 "must be a positive integer rank up to 65536"));
      c.r = v.get<int64_t>();
    } else if (key == "lora_alpha") {
      DC_RETURN_IF_ERROR(must_be(v.is_number() && std::isfinite(v.get<double>()), "must be a finite number"));
      c.lora_alpha = v.get<double>();
    } else if (key == "lora_dropout") {  // training only (a resumed run's)
      DC_RETURN_IF_ERROR(must_be(v.is_null() || (v.is_number() && v.get<double>() >= 0 && v.get<double>() < 1),
                                 "must be a number in [0, 1)"));
      c.lora_dropout = v.is_null() ? 0.0 : v.get<double>();
    } else if (key == "use_rslora") {
      DC_RETURN_IF_ERROR(must_be(v.is_boolean(), "must be true or false"));
      c.use_rslora = v.get<bool>();
    } else if (key == "target_modules") {
      DC_RETURN_IF_ERROR(parse_targets(v, path, c));
      have_targets = true;
    } else if (key == "modules_to_save") {
      DC_ASSIGN_OR_RETURN(c.modules_to_save, string_list(v, path, key));
    } else if (key == "bias") {
      DC_RETURN_IF_ERROR(must_be(v.is_null() || v == Json("none"), "must be \"none\": LoRA biases are not supported"));
    } else if (key == "fan_in_fan_out" || key == "use_dora" || key == "lora_bias" || key == "use_qalora") {
      DC_RETURN_IF_ERROR(must_be(is_off(v), "must be false: not supported"));
    } else if (key == "layers_to_transform") {
      if (v.is_number_integer()) {
        c.layers_to_transform = {v.get<int64_t>()};
      } else if (v.is_array()) {
        for (const Json& e : v) {
          if (!e.is_number_integer()) return field_error(path, key, "must hold layer indices (got " + e.dump() + ")");
          c.layers_to_transform.push_back(e.get<int64_t>());
        }
      } else {
        DC_RETURN_IF_ERROR(must_be(v.is_null(), "must be null, a layer index or a list of them"));
      }
    } else if (key == "rank_pattern") {
      DC_RETURN_IF_ERROR(parse_pattern(v, path, key, &c.rank_pattern));
    } else if (key == "alpha_pattern") {
      DC_RETURN_IF_ERROR(parse_pattern(v, path, key, &c.alpha_pattern));
    } else if (!is_off(v)) {  // layer_replication, exclude_modules, trainable_token_indices, target_parameters, ...
      return field_error(path, key, "is set (" + v.dump() + ") but not supported by the merge; unset it or merge "
                                     "the adapter with PEFT (merge_and_unload) and load the result");
    }
  }
  if (!have_targets) return field_error(path, "target_modules", "is missing or null; name the modules the adapter changes");
  return Status();
}

}  // namespace

Result<LoraConfig> parse_lora_config(const std::string& text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    return parse_error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) return parse_error(path + ": not a JSON object");
  if (!j.contains("peft_type")) return field_error(path, "peft_type", "is missing (is this a PEFT adapter_config.json?)");
  LoraConfig c;
  DC_RETURN_IF_ERROR(parse_fields(j, path, c));
  return c;
}

Result<LoraAdapter> open_lora_adapter(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return not_found("LoRA adapter '" + dir + "' is not a directory (expected adapter_config.json and "
                     "adapter_model.safetensors in it)");
  LoraAdapter a;
  a.dir = dir;
  a.config_path = (fs::path(dir) / "adapter_config.json").string();
  if (!fs::exists(a.config_path, ec)) return not_found(a.config_path + " is missing (is " + dir + " a PEFT adapter?)");
  DC_ASSIGN_OR_RETURN(std::string text, read_text_file(a.config_path));
  DC_ASSIGN_OR_RETURN(a.config, parse_lora_config(text, a.config_path));
  const std::string weights = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(weights, ec)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin", ec))
      return not_found(weights + " is missing; only the safetensors format is read (adapter_model.bin is a pickle): "
                       "save the adapter with save_pretrained(..., safe_serialization=True)");
    return not_found(weights + " is missing");
  }
  DC_ASSIGN_OR_RETURN(a.weights, SafetensorsFile::open(weights));
  return a;
}

namespace {

// The modules of the model a LoRA may change (every matrix of the layers, and an untied lm_head), with
// their weight shapes; the embedding table only through modules_to_save.
struct ModuleInfo {
  std::string weight_name;
  std::vector<int64_t> shape;  // [out, in]
  int64_t layer = -1;
};

std::map<std::string, ModuleInfo> linear_modules(const ModelConfig& config) {
  std::map<std::string, ModuleInfo> out;
  ModelWeights scratch;
  visit_weights(config, scratch, [&](const WeightSlot& slot) {
    if (slot.matrix == nullptr || slot.name == "model.embed_tokens.weight") return;
    const std::string module = slot.name.substr(0, slot.name.size() - 7);  // less ".weight"
    int64_t layer = -1;
    if (module.rfind("model.layers.", 0) == 0) layer = std::stoll(module.substr(13));
    out[module] = {slot.name, slot.shape, layer};
  });
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// PEFT's check_target_module_exists for one entry of a target_modules list.
bool list_entry_selects(const std::string& entry, const std::string& module) {
  return module == entry || ends_with(module, "." + entry);
}

bool selects(const LoraConfig& c, const std::string& module, const ModuleInfo& info) {
  bool found = false;
  if (c.all_linear) {
    found = info.layer >= 0;
  } else if (c.target_regex) {
    found = std::regex_match(module, std::regex(*c.target_regex));
  } else {
    for (const std::string& e : c.target_list) found = found || list_entry_selects(e, module);
  }
  if (found && !c.layers_to_transform.empty()) {
    found = false;
    for (int64_t l : c.layers_to_transform) found = found || l == info.layer;
  }
  return found;
}

// The first entry of a rank_pattern / alpha_pattern whose key matches the module as PEFT matches it
// (re.match of `(.*\.)?KEY$`), or nullptr.
template <class T>
const std::pair<std::string, T>* pattern_entry(const std::vector<std::pair<std::string, T>>& pattern,
                                               const std::string& module) {
  for (const auto& entry : pattern)
    if (std::regex_match(module, std::regex("(.*\\.)?" + entry.first))) return &entry;
  return nullptr;
}

// The module and kind of a PEFT tensor name: "base_model.model.<module>.lora_A[.<adapter>].weight".
struct TensorName {
  std::string module, kind;  // kind: lora_A, lora_B, lora_embedding_A/B, lora_magnitude_vector, or "" (saved module)
};

Result<TensorName> split_name(const TensorInfo& t) {
  const std::string prefix = "base_model.model.";
  if (t.name.rfind(prefix, 0) != 0)
    return invalid_argument(t.file + ": tensor '" + t.name + "' is not a PEFT LoRA tensor name (expected "
                            "base_model.model.<module>.lora_A.weight / lora_B.weight)");
  std::string rest = t.name.substr(prefix.size());
  if (ends_with(rest, ".weight")) rest.resize(rest.size() - 7);  // (embedding LoRAs have no ".weight")
  static const std::regex kLora(R"((.+)\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector)(\.[^.]+)?)");
  static const std::regex kSaved(R"((.+)\.modules_to_save\.[^.]+)");
  std::smatch m;
  if (std::regex_match(rest, m, kLora)) return TensorName{m[1].str(), m[2].str()};
  if (std::regex_match(rest, m, kSaved)) return TensorName{m[1].str(), ""};
  return TensorName{rest, ""};
}

Status check_matrix(const TensorInfo& t, const std::vector<int64_t>& want, const std::string& why) {
  if (!is_float_dtype(t.dtype))
    return invalid_argument(t.file + ": tensor '" + t.name + "' is " + dtype_name(t.dtype) + "; expected F32, F16 or BF16");
  if (t.shape != want)
    return invalid_argument(t.file + ": tensor '" + t.name + "' has shape " + shape_text(t.shape) + " but " + why +
                            " implies " + shape_text(want));
  return Status();
}

// modules_to_save: each entry must name embed_tokens or lm_head, and the file must hold its tensor.
Status plan_saved(const LoraAdapter& a, const ModelConfig& config, const std::map<std::string, const TensorInfo*>& saved,
                  LoraPlan& plan) {
  const std::string& path = a.config_path;
  std::set<std::string> wanted;
  for (const std::string& e : a.config.modules_to_save) {
    if (list_entry_selects(e, "model.embed_tokens")) {
      wanted.insert("model.embed_tokens");
    } else if (list_entry_selects(e, "lm_head")) {
      if (config.tie_word_embeddings)
        return field_error(path, "modules_to_save", "names 'lm_head' but the model ties it to embed_tokens "
                                                    "(tie_word_embeddings); save embed_tokens instead");
      wanted.insert("lm_head");
    } else {
      return field_error(path, "modules_to_save", "names '" + e + "': only embed_tokens and lm_head can be saved "
                                                  "whole here");
    }
  }
  for (const auto& [module, t] : saved)
    if (!wanted.count(module))
      return invalid_argument(t->file + ": tensor '" + t->name + "' is a whole module (" + module + ") but " + path +
                              " does not list it in modules_to_save (or the model has no such module)");
  for (const std::string& module : wanted) {
    auto it = saved.find(module);
    const std::string weight = module + ".weight";
    if (it == saved.end())
      return not_found(a.weights.path() + ": tensor 'base_model.model." + weight + "' is missing; " + path +
                       " lists it in modules_to_save");
    DC_RETURN_IF_ERROR(check_matrix(*it->second, {config.n_vocab, config.n_embd}, "the model's " + weight));
    plan.replacements.push_back({weight, it->second});
  }
  return Status();
}

// Every target_modules entry (or the regex) must select some module the model has.
Status check_targets_exist(const LoraConfig& c, const std::string& path, const std::map<std::string, ModuleInfo>& modules) {
  static const std::set<std::string> kNotLinear = {"embed_tokens", "model.embed_tokens", "norm", "input_layernorm",
                                                   "post_attention_layernorm", "self_attn", "mlp", "act_fn",
                                                   "rotary_emb", "model", "layers"};
  for (const std::string& e : c.target_list) {
    bool any = false;
    for (const auto& [module, info] : modules) any = any || list_entry_selects(e, module);
    if (any) continue;
    if (e == "embed_tokens" || e == "model.embed_tokens")
      return field_error(path, "target_modules", "names 'embed_tokens': embedding LoRA (lora_embedding_A/B) is not "
                                                 "supported; list embed_tokens in modules_to_save instead");
    if (kNotLinear.count(e))
      return field_error(path, "target_modules", "names '" + e + "', which is not a linear module; LoRA here targets "
                                                 "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj lm_head");
    return field_error(path, "target_modules", "names '" + e + "', a module the model does not have (its linear "
                                               "modules: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj lm_head)");
  }
  if (c.target_regex) {
    bool any = false;
    for (const auto& [module, info] : modules) any = any || selects(c, module, info);
    if (!any)
      return field_error(path, "target_modules", "'" + *c.target_regex + "' matches none of the model's linear modules "
                                                 "(e.g. model.layers.0.self_attn.q_proj)");
  }
  return Status();
}

}  // namespace

Result<LoraPlan> plan_lora(const LoraAdapter& a, const ModelConfig& config) {
  const LoraConfig& c = a.config;
  const std::map<std::string, ModuleInfo> modules = linear_modules(config);
  DC_RETURN_IF_ERROR(check_targets_exist(c, a.config_path, modules));
  for (int64_t l : c.layers_to_transform)
    if (l < 0 || l >= config.n_layer)
      return field_error(a.config_path, "layers_to_transform", "holds " + std::to_string(l) + " but the model has " +
                                                               std::to_string(config.n_layer) + " layers");
  std::map<std::string, std::pair<const TensorInfo*, const TensorInfo*>> pairs;  // module → (A, B)
  std::map<std::string, const TensorInfo*> saved;
  std::vector<std::string> order;
  for (const auto& [name, t] : a.weights.tensors()) {
    DC_ASSIGN_OR_RETURN(TensorName n, split_name(t));
    if (n.kind == "lora_embedding_A" || n.kind == "lora_embedding_B")
      return invalid_argument(t.file + ": tensor '" + name + "' is an embedding LoRA (" + n.kind + "), which is not "
                              "supported; save embed_tokens whole (modules_to_save) instead");
    if (n.kind == "lora_magnitude_vector")
      return invalid_argument(t.file + ": tensor '" + name + "' is a DoRA magnitude vector; DoRA is not supported");
    if (n.kind.empty()) {
      saved[n.module] = &t;
      continue;
    }
    auto m = modules.find(n.module);
    if (m == modules.end())
      return invalid_argument(t.file + ": tensor '" + name + "' is for module '" + n.module + "', which the model (" +
                              std::to_string(config.n_layer) + " layers) does not have or LoRA cannot change here");
    if (!selects(c, n.module, m->second))
      return invalid_argument(t.file + ": tensor '" + name + "' is for module '" + n.module + "', which " +
                              a.config_path + "'s target_modules / layers_to_transform do not select");
    auto& p = pairs[n.module];
    const TensorInfo*& slot = n.kind == "lora_A" ? p.first : p.second;
    if (slot != nullptr)
      return invalid_argument(t.file + ": tensors '" + slot->name + "' and '" + name + "' are both the " + n.kind +
                              " of " + n.module);
    slot = &t;
  }
  LoraPlan plan;
  for (const auto& [module, info] : modules) {
    if (!selects(c, module, info)) continue;
    auto it = pairs.find(module);
    const TensorInfo* A = it == pairs.end() ? nullptr : it->second.first;
    const TensorInfo* B = it == pairs.end() ? nullptr : it->second.second;
    if (A == nullptr || B == nullptr)
      return not_found(a.weights.path() + ": tensor 'base_model.model." + module + (A == nullptr ? ".lora_A" : ".lora_B") +
                       ".weight' is missing; " + a.config_path + "'s target_modules select " + module);
    std::string r_field = "r";
    int64_t r = c.r;
    double alpha = c.lora_alpha;
    if (const auto* e = pattern_entry(c.rank_pattern, module)) r = e->second, r_field = "rank_pattern[\"" + e->first + "\"]";
    if (const auto* e = pattern_entry(c.alpha_pattern, module)) alpha = e->second;
    const std::string why = a.config_path + "'s " + r_field + " (" + std::to_string(r) + ") and " + info.weight_name + " " +
                            shape_text(info.shape);
    DC_RETURN_IF_ERROR(check_matrix(*A, {r, info.shape[1]}, why));
    DC_RETURN_IF_ERROR(check_matrix(*B, {info.shape[0], r}, why));
    const double scale = c.use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
    plan.updates.push_back({info.weight_name, A, B, r, static_cast<float>(scale)});
  }
  DC_RETURN_IF_ERROR(plan_saved(a, config, saved, plan));
  for (const LoraReplacement& rep : plan.replacements)
    for (const LoraUpdate& u : plan.updates)
      if (u.weight_name == rep.weight_name)
        return field_error(a.config_path, "modules_to_save", "saves " + rep.weight_name + " whole, which target_modules "
                                                             "also changes with a LoRA");
  return plan;
}

}  // namespace dc
