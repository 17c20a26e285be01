// Synthetic models for benchmarks: a named Dream shape with random weights built in memory, no file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/quantize.h"
#include "model/transformer.h"

namespace dc {

// The config of a named shape: "diffucoder-7b" (the real DiffuCoder-7B config), "qwen2.5-0.5b"
// (Dream architecture at Qwen2.5-0.5B size: 24 layers, 896 hidden, 14 / 2 heads, ffn 4864, vocab
// 151936, untied lm_head) or "tiny" (2 layers, 64 hidden, vocab 4096). Errors list the names.
Result<ModelConfig> synthetic_config(const std::string& shape);
std::vector<std::string> synthetic_shape_names();

// A model of `config` whose matrices are random bf16 (uniform, std 0.02), norm weights 1 and biases
// small random, filled in parallel on `pool` from `seed`. Memory: 2 bytes per matrix parameter.
// With `quantize`, each matrix convert would quantize is quantized right after it is drawn and its bf16
// copy dropped, so the peak memory is that of the quantized model plus one bf16 matrix.
Result<std::unique_ptr<Model>> make_synthetic_model(const ModelConfig& config, uint64_t seed, ThreadPool* pool,
                                                    const QuantizeOptions* quantize = nullptr);

}  // namespace dc
