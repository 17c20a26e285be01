// A --model path for the callers that need a model's config, f32 weights or tokenizer without an Engine
// (train, grpo, grpo-loss, bench --train, inspect, tokenize): a Hugging Face checkpoint directory, or a
// dream GGUF file (a path ending in ".gguf", gguf/dream.h). The Engine resolves the same paths for
// inference (engine/engine.cc).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/params.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"
#include "types/model_config.h"

namespace dc {

// The model's config: the directory's config.json, or the GGUF's dream metadata. Errors name the path.
Result<ModelConfig> model_source_config(const std::string& path);

// The config as config.json fields (what a training checkpoint writes beside its weights): the
// directory's config.json as it is, or the GGUF's dream metadata (dream_config_json). Not validated.
Result<nlohmann::json> model_source_config_json(const std::string& path);

// f32 copies of the weights, to train: a directory's tensors widened (ModelParams::from_checkpoint);
// a GGUF's F32 / F16 / BF16 tensors widened. A GGUF with a quantized matrix (any ggml block type) is
// refused with an error naming the tensor and its type and saying what to train from instead.
// *config receives the model's config.
Result<ModelParams> load_trainable_params(const std::string& path, ModelConfig* config);

// The model as it is stored (bf16 / f16 / f32, q8 / q4, or a GGUF's blocks read in place): a frozen base
// for LoRA training (train / grpo --lora-r), which reads it without widening it.
Result<std::unique_ptr<Model>> load_model_source(const std::string& path, ThreadPool* pool);

// The tokenizer: DIR/tokenizer.json, or the GGUF's tokenizer.ggml metadata (gguf_tokenizer).
Result<Tokenizer> model_source_tokenizer(const std::string& path);

}  // namespace dc
