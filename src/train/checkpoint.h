// Training checkpoints: OUT/checkpoint-<step>/ holds a Hugging Face model directory (config.json,
// model.safetensors in f32, the source's tokenizer and generation files) plus optimizer.safetensors
// (Adam moments) and trainer_state.json (step, data cursor, seed). Written atomically (io/atomic_dir.h).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/params.h"

namespace dc::train {

struct TrainState {
  int64_t step = 0;     // optimizer steps done
  int64_t cursor = 0;   // training samples consumed (the data position)
  uint64_t seed = 0;
  std::string options;  // the options that must not change on --resume (checked as a string)
};

// "checkpoint-000042" for step 42.
std::string checkpoint_name(int64_t step);

// Writes dir (replacing an older one) from the model in source_model_dir (its config.json, with
// torch_dtype "float32", and every small non-weight file) and the given tensors and state. With
// ref_model (GRPO's reference model), its weights go to ref_model.safetensors (Hugging Face names, f32).
Status save_train_checkpoint(const std::string& dir, const std::string& source_model_dir, const ModelParams& params,
                             const ModelParams& m, const ModelParams& v, const TrainState& state,
                             const ModelParams* ref_model = nullptr);

// The newest complete checkpoint directory under out_dir ("" when there is none).
std::string find_latest_checkpoint(const std::string& out_dir);

// The checkpoint a run writing to out_dir continues from: with resume the newest one ("" when there is
// none or out_dir is ""), else "". invalid_argument when out_dir holds one and neither resume nor force.
Result<std::string> checkpoint_to_resume(const std::string& out_dir, bool resume, bool force);

// Reads optimizer.safetensors and trainer_state.json of a checkpoint into m, v (shaped like the model)
// and state, and with ref_model its ref_model.safetensors. Errors name the file and the tensor.
Status load_train_state(const std::string& dir, ModelParams& m, ModelParams& v, TrainState& state,
                        ModelParams* ref_model = nullptr);

}  // namespace dc::train
