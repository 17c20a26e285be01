// convert_checkpoint: writes a quantized copy of a checkpoint directory (`diffucoder convert`; formats
// in README.md "Quantized weights").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/quantize.h"

namespace dc {

// One tensor of a conversion, reported after it is done.
struct ConvertProgress {
  int64_t index = 0, count = 0;   // 1-based index among count tensors
  std::string name;
  std::string action;             // "q8", "q4" or "copy"
  size_t in_bytes = 0, out_bytes = 0;
  double seconds = 0;             // since the conversion started
};

struct ConvertOptions {
  std::string model_dir, out_dir;
  QuantizeOptions quantize;                      // format kNone (with replacements only): every tensor as stored
  // Tensors written instead of the source's of the same name (same dtype and shape; `convert --lora`'s
  // merged matrices). Their data stays the caller's and must live through the call.
  std::map<std::string, TensorInfo> replacements;
  bool force = false;                            // replace an existing out_dir
  size_t shard_bytes = size_t{2} << 30;          // more output than this: model-0000i-of-0000N shards
  std::function<void(const ConvertProgress&)> on_tensor;  // optional
};

// Writes a quantized copy of the checkpoint in model_dir to out_dir (with quantize.format kNone an
// unquantized one, e.g. with replacements: a LoRA merged): config.json with a "quantization" object, the other small files copied (generation_config.json, tokenizer files; not
// other weight files), and safetensors holding every matrix should_quantize() accepts as
// `<name>` codes + `<name>.scale` (+ `<name>.min`), every other tensor as stored. Everything goes to
// `<out_dir>.tmp.<pid>`, which is renamed to out_dir at the end (and removed on failure). Refuses an
// existing out_dir unless force, an already quantized model, and tensors whose shape disagrees with
// config.json; errors name the file or tensor.
Status convert_checkpoint(const ConvertOptions& options, ThreadPool* pool);

}  // namespace dc
