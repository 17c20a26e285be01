// Engines over the reference fixtures for the engine and server tests.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"

namespace dc::testing {

// Engine::load of `dir` with `threads` threads. `precision` unset follows the checkpoint (the default);
// MatmulPrecision::kF32 is the exact path the parity tests compare against the PyTorch reference.
inline Result<std::unique_ptr<Engine>> load_engine(const std::string& dir, int threads,
                                                   std::optional<MatmulPrecision> precision = std::nullopt,
                                                   const std::string& weight_cache = "") {
  EngineOptions options;
  options.model_dir = dir;
  options.n_threads = threads;
  options.matmul_precision = precision;
  options.weight_cache = weight_cache;
  return Engine::load(options);
}

// The exact path: f32 matmul activations (`--precision f32`), whatever the checkpoint's dtype.
inline Result<std::unique_ptr<Engine>> load_exact(const std::string& dir, int threads) {
  return load_engine(dir, threads, MatmulPrecision::kF32);
}

// The sampling parameters of a reference generate.json case (its "params") on `engine`'s defaults.
inline SamplingParams reference_params(const Engine& engine, const nlohmann::json& p) {
  SamplingParams s = engine.default_params();
  s.alg = parse_algorithm(p["alg"].get<std::string>()).value();
  s.steps = p["steps"].get<int>();
  s.max_new_tokens = p["max_new_tokens"].get<int64_t>();
  s.eps = p["eps"].get<float>();
  s.temperature = p["temperature"].get<float>();
  s.top_p = p["top_p"].is_null() ? 1.0f : p["top_p"].get<float>();
  s.top_k = p["top_k"].is_null() ? 0 : p["top_k"].get<int64_t>();
  s.alg_temp = p["alg_temp"].is_null() ? 0.0f : p["alg_temp"].get<float>();
  return s;
}

}  // namespace dc::testing
