// The `dream` architecture of llama.cpp's converter (convert_hf_to_gguf.py DreamModel): its metadata as
// our ModelConfig, its tensor names as ours (no permutation: Qwen2 q/k are stored as in Hugging Face, a
// matrix [rows, cols] as GGUF dims [cols, rows]), and a GGUF file loaded as ModelWeights.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "model/weights.h"
#include "types/model_config.h"

namespace dc {

// True when `path` names a GGUF file (ends in ".gguf"): the loaders' dispatch.
bool is_gguf_path(std::string_view path);

// Our (Hugging Face) tensor name → the GGUF one: "model.embed_tokens.weight" → "token_embd.weight",
// "model.layers.3.self_attn.q_proj.bias" → "blk.3.attn_q.bias", "lm_head.weight" → "output.weight", ...
// "" for a name the dream architecture does not have.
std::string gguf_tensor_name(const std::string& hf_name);

// The special token ids GGUF keeps as tokenizer.ggml.*_token_id, and the config.json field / ModelConfig
// member each fills (the mask token has its own key and a fallback: see dream_config).
struct GgufTokenIdKey {
  const char* key;
  const char* config_field;
  int64_t ModelConfig::*member;
};
inline constexpr GgufTokenIdKey kGgufTokenIds[] = {
    {"tokenizer.ggml.bos_token_id", "bos_token_id", &ModelConfig::bos_token_id},
    {"tokenizer.ggml.eos_token_id", "eos_token_id", &ModelConfig::eos_token_id},
    {"tokenizer.ggml.padding_token_id", "pad_token_id", &ModelConfig::pad_token_id},
};
inline constexpr const char* kGgufMaskTokenId = "tokenizer.ggml.mask_token_id";

// The ModelConfig of a dream GGUF: general.architecture must be "dream"; dream.embedding_length,
// feed_forward_length, block_count, attention.head_count (and head_count_kv, key_length when present),
// context_length, rope.freq_base, attention.layer_norm_rms_epsilon; n_vocab from token_embd.weight;
// token ids from tokenizer.ggml.{mask,padding,bos,eos}_token_id (mask: else the token "<|mask|>");
// tied embeddings when output.weight is absent. Validated as config.json is (io/config_json.h); errors
// name the file and the key.
Result<ModelConfig> dream_config(const GgufFile& file);
// Those metadata as the config.json fields dream_config validates (model_type "Dream"; what a training
// checkpoint started from the file writes as its config.json). Not validated: dream_config does that.
Result<nlohmann::json> dream_config_json(const GgufFile& file);

// How loading stores each GGUF type: every matrix stays in the mapped file as it is. F32 / F16 / BF16
// ones are dense WeightViews; the ggml block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K) are WeightQuant::kGguf views of their blocks, which the matmul kernels read in place
// (ops/cpu/matmul_gguf.h), so the loaded model takes about the file's size. Each block's scales are
// checked finite at load. Norms and biases become f32.
struct GgufModel {
  ModelConfig config;
  ModelWeights weights;
  std::shared_ptr<const void> storage;  // the mapped file, the repacked matrices and the f32 vectors
  const GgufFile* file = nullptr;       // the mapped file (its metadata, e.g. the tokenizer), in storage
};

// Opens `path`, reads its config and binds every tensor the config implies (shape and type checked;
// errors name the GGUF tensor and our name). `pool` threads the check of the blocks' scales.
Result<GgufModel> load_gguf_model(const std::string& path, ThreadPool* pool);

}  // namespace dc
