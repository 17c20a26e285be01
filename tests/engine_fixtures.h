// Engines over the reference fixtures for the engine and server tests.
#pragma once

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

}  // namespace dc::testing
