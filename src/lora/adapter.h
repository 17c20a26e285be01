// PEFT LoRA adapters (a directory with adapter_config.json + adapter_model.safetensors, as PEFT's
// save_pretrained writes them): the config's fields, the tensors, and the plan of what they change in a
// model of a given ModelConfig (docs/lora.md). model/ and io/ only; lora/merge.h applies a plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "types/model_config.h"

namespace dc {

// adapter_config.json, the fields that matter for a merge (and lora_dropout, for a resumed run; the training-only
// ones such as init_lora_weights, task_type, are read past; a field that would change the result and that the merge
// does not implement is an error naming it).
struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  bool use_rslora = false;  // scale = alpha / sqrt(r) instead of alpha / r
  double lora_dropout = 0;  // training only: the dropout a resumed run continues with
  // target_modules: a list (a module is selected when its name equals an entry or ends with "." + entry)
  // or one regex string (selected when it matches the whole module name, Python's re.fullmatch), or
  // "all-linear" (every projection of every layer, not the lm_head).
  std::vector<std::string> target_list;
  std::optional<std::string> target_regex;
  bool all_linear = false;
  std::vector<std::string> modules_to_save;  // "embed_tokens" / "lm_head": whole tensors replaced
  std::vector<int64_t> layers_to_transform;  // empty: every layer
  // Per-module rank / alpha: the first key (file order) whose regex `(.*\.)?KEY` matches the whole module name.
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
};

// Parses adapter_config.json's text; `path` names it in errors (which name the field). Refuses
// peft_type other than "LORA", bias other than "none", fan_in_fan_out, use_dora, layer_replication,
// layers_pattern other than "layers", exclude_modules and any unknown field set to a non-default value.
Result<LoraConfig> parse_lora_config(const std::string& text, const std::string& path);

// An opened adapter: its config and its mapped tensors.
struct LoraAdapter {
  std::string dir;
  std::string config_path;   // DIR/adapter_config.json
  LoraConfig config;
  SafetensorsFile weights;   // DIR/adapter_model.safetensors
};

// Opens DIR (kNotFound naming the missing file; an adapter_model.bin alone is refused with a hint).
Result<LoraAdapter> open_lora_adapter(const std::string& dir);

// One matrix the adapter changes: W' = W + scale · B·A.
struct LoraUpdate {
  std::string weight_name;    // our checkpoint name, "model.layers.3.self_attn.q_proj.weight"
  const TensorInfo* a = nullptr;  // lora_A [r, in]
  const TensorInfo* b = nullptr;  // lora_B [out, r]
  int64_t rank = 0;
  float scale = 0;
};

// One matrix the adapter replaces whole (modules_to_save).
struct LoraReplacement {
  std::string weight_name;    // "model.embed_tokens.weight" or "lm_head.weight"
  const TensorInfo* tensor = nullptr;  // [n_vocab, n_embd]
};

struct LoraPlan {
  std::vector<LoraUpdate> updates;          // in the adapter file's tensor order
  std::vector<LoraReplacement> replacements;
};

// Matches the adapter's tensors and target_modules against a model of `config`: every tensor must be a
// lora_A / lora_B of a module target_modules selects (PEFT's names: "base_model.model.<module>.lora_A.weight",
// also with an adapter-name infix "lora_A.<name>.weight") or a modules_to_save tensor; every selected
// module must have both, with shapes [r, in] / [out, r] that fit the module and the rank of r /
// rank_pattern; every target_modules entry must select a module the model has. Errors name the file and
// the field or tensor. The plan points into adapter.weights.
Result<LoraPlan> plan_lora(const LoraAdapter& adapter, const ModelConfig& config);

}  // namespace dc
