// Reading a checkpoint's config.json (Dream / Qwen2 architecture, and the "quantization" block of a
// converted checkpoint) into ModelConfig and its optional generation_config.json into
// GenerationConfigFile, with type checks and validation.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "types/model_config.h"

namespace dc {

// The limits of config.json sizes, checked before any memory is sized by them (README "Limits");
// DiffuCoder-7B: vocab 152064, hidden 3584, intermediate 18944, 28 layers, 28 / 4 heads, head_dim 128,
// context 131072.
inline constexpr int64_t kMaxConfigVocab = int64_t{1} << 24;
inline constexpr int64_t kMaxConfigHidden = int64_t{1} << 16;
inline constexpr int64_t kMaxConfigIntermediate = int64_t{1} << 18;
inline constexpr int64_t kMaxConfigLayers = 1024;
inline constexpr int64_t kMaxConfigHeads = 1024;
inline constexpr int64_t kMaxConfigHeadDim = 4096;
inline constexpr int64_t kMaxConfigContext = int64_t{1} << 24;

// Parses config.json text. Missing keys keep the configuration_dream.py defaults (the ModelConfig
// member initialisers); head_dim, when absent or null, is hidden_size / num_attention_heads. Token ids
// may be null (-> -1) or a list (-> its first element, -1 when empty); `torch_dtype` falls back to
// the newer `dtype` key. Rejected, with a message naming the field, its expected type and `path`:
// wrong JSON types; hidden_act other than "silu"; rope_scaling other than null / type "default" and
// use_sliding_window or use_mrope true, model_type other than Dream / qwen2 (kUnimplemented);
// torch_dtype other than bfloat16 / float16 / float32; a NUL byte; non-positive sizes or sizes above the
// limits above (a message marks a size absent from the file as the default); hidden_size not divisible
// by num_attention_heads (when head_dim is not given); heads not divisible by key/value heads; odd
// head_dim; token ids outside [-1, vocab_size); rms_norm_eps or rope_theta not finite and > 0.
// The "quantization" block goes to ModelConfig::quantization as parse_quantization_config reads it.
// Unknown keys are ignored. `path` is only used in messages.
Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& path);

// Reads only the "quantization" object of config.json text (absent or null: format kNone). Errors name
// `path` and the field: format other than "q8" / "q4", group_size missing, not an integer or not valid.
Result<QuantizationConfig> parse_quantization_config(std::string_view json_text, const std::string& path);

// Reads `path` and parses it as parse_model_config does; a missing file gives kNotFound.
Result<ModelConfig> load_model_config(const std::string& path);

// Parses generation_config.json text: every key optional, nulls and absent keys stay unset (-1 / "").
// Known keys: alg (string), temperature, top_p, eps, alg_temp (numbers), top_k, steps, max_new_tokens,
// max_length (integers), mask/pad/bos/eos_token_id (integer or list: first element). Wrong types and
// negative values (which would read as "unset") are errors naming the field and `path`. Sets present.
Result<GenerationConfigFile> parse_generation_config(std::string_view json_text, const std::string& path);

// Reads `path` and parses it as parse_generation_config does; a missing file gives kNotFound.
Result<GenerationConfigFile> load_generation_config(const std::string& path);

}  // namespace dc
