// A PEFT LoRA adapter with random values (B non-zero, unlike PEFT's initialisation, so that it changes the
// model's tokens) written for a model of a given config: a second adapter for the tests of serve's
// per-request adapters, beside the lora_fixtures' list_all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/splitmix64.h"
#include "lora/trainable.h"

namespace dc::testing {

// Writes DIR/adapter_config.json + adapter_model.safetensors: rank r, alpha 2r, `targets` (bit t: lora target
// t) of every layer, each value uniform in (-amplitude, amplitude) drawn from `seed`.
inline Status write_random_adapter(const std::string& dir, const ModelConfig& config, int64_t r, uint32_t targets,
                                   uint64_t seed, float amplitude) {
  LoraSpec spec;
  spec.r = r;
  spec.alpha = 2.0 * static_cast<double>(r);
  spec.targets = targets;
  LoraParams p = LoraParams::zeros(config, spec);
  for (int64_t i = 0; i < p.n_values(); ++i) {
    const uint64_t h = splitmix64(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
    p.data()[i] = amplitude * (static_cast<float>(h >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return p.save_peft(dir, "test");
}

}  // namespace dc::testing
