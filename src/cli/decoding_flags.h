// The decoding flags `generate` and `eval` share: the sampler's settings, block decoding and the fast
// mode, and the engine's threads, matmul precision and packed-weight cache.
#pragma once

#include <CLI/CLI.hpp>
#include <diffucoder/diffucoder.h>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "sampler/generate.h"

namespace dc::cli {

struct DecodingFlags {
  std::string alg = "entropy";
  float temperature = 0.0f, top_p = 1.0f, alg_temp = 0.0f, eps = 1e-3f;
  int64_t top_k = 50;
  uint64_t seed = 0;
  int64_t block_length = 0;
  std::string cache = "none";
  int refresh_every = 4;  // --refresh-every K (cache committed)
  float threshold = 0.0f, factor = 0.0f;
  bool fast = false;
  int threads = 0;
  std::string precision = "auto", weight_cache;
  std::string device = "cpu";
  std::string lora;  // --lora DIR: a PEFT adapter merged at load (docs/lora.md)
  std::string lora_mode = "merged";  // --lora-mode merged | unmerged
};

// --alg --temperature --top-p --top-k --alg-temp --eps --seed --block-length --cache --refresh-every --threshold --factor
// --fast --threads --precision --weight-cache --device --lora --lora-mode.
void add_decoding_flags(CLI::App* cmd, DecodingFlags* flags);

// `c` with the flags' sampler fields (and `fast`, resolved by whoever turns the config into the sampler's
// parameters). The caller sets the lengths, steps and sequences; the facade checks the values.
diffucoder::GenerationConfig apply_decoding_flags(diffucoder::GenerationConfig c, const DecodingFlags& flags);

// EngineOptions for `model_dir` with the flags' threads, precision, weight cache, device and LoRA adapter; errors name the flag.
Result<EngineOptions> engine_options(const DecodingFlags& flags, const std::string& model_dir,
                                     const std::string& tokenizer_path);
// The facade's LoadOptions of the same (checked by Model::load, whose errors name the option).
diffucoder::LoadOptions load_options(const DecodingFlags& flags, const std::string& model_dir,
                                     const std::string& tokenizer_path);

}  // namespace dc::cli
