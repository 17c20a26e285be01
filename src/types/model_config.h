// ModelConfig: the Dream / Qwen2 architecture numbers, special token ids and quantization of a
// checkpoint. Filled from config.json by io/config_json.h (parsed once, when the checkpoint is opened);
// defaults are those of configuration_dream.py.
#pragma once

#include <cstdint>
#include <string>

#include "types/quantization.h"

namespace dc {

struct ModelConfig {
  std::string model_type = "Dream";
  std::string torch_dtype = "bfloat16";
  std::string hidden_act = "silu";           // only "silu" is supported
  int64_t n_vocab = 151936;                  // vocab_size: embedding and lm_head rows
  int64_t n_embd = 4096;                     // hidden_size
  int64_t n_ff = 22016;                      // intermediate_size
  int64_t n_layer = 32;                      // num_hidden_layers
  int64_t n_head = 32;                       // num_attention_heads
  int64_t n_head_kv = 32;                    // num_key_value_heads
  int64_t head_dim = 128;                    // hidden_size / num_attention_heads
  int64_t max_position_embeddings = 32768;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;          // true: lm_head reuses model.embed_tokens.weight
  int64_t mask_token_id = 151666;
  int64_t pad_token_id = 151643;
  int64_t bos_token_id = 151643;             // -1 when null
  int64_t eos_token_id = 151643;             // -1 when null
  QuantizationConfig quantization;           // the "quantization" block (`diffucoder convert`); kNone: dense
};

// Optional defaults from generation_config.json (absent keys stay unset = negative / NaN / empty).
struct GenerationConfigFile {
  bool present = false;
  std::string alg;                           // "" when absent
  double temperature = -1, top_p = -1, eps = -1, alg_temp = -1;
  int64_t top_k = -1, steps = -1, max_new_tokens = -1, max_length = -1;
  int64_t mask_token_id = -1, pad_token_id = -1, bos_token_id = -1, eos_token_id = -1;
};

}  // namespace dc
