// Training checkpoints: OUT/checkpoint-<step>/ holds a Hugging Face model directory (config.json,
// model.safetensors in f32, the source's tokenizer and generation files) plus optimizer.safetensors
// (Adam moments) and trainer_state.json (step, data cursor, seed). Written atomically (io/atomic_dir.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "dist/comm.h"
#include "model/params.h"

namespace dc::train {

struct TrainState {
  int64_t step = 0;     // optimizer steps done
  int64_t cursor = 0;   // training samples consumed (the data position)
  uint64_t seed = 0;
  std::string options;  // the options that must not change on --resume (checked as a string)
  // Steps whose update was skipped (a non-finite loss or gradient norm; OptimizerCore::step); saved as
  // trainer_state.json's "skipped_steps" when not 0.
  int64_t skipped_steps = 0;
};

// What a resumed run expects of a checkpoint's state: step ≤ total_steps and a multiple of
// steps_per_round, cursor = step / steps_per_round · samples_per_round (the data the steps consumed), seed
// the run's. SFT: one step a round of batch · grad_accum samples; GRPO: num_iterations steps a round of
// prompts_per_round prompts.
struct ResumeExpectations {
  int64_t total_steps = 0;
  int64_t steps_per_round = 1;
  int64_t samples_per_round = 0;
  uint64_t seed = 0;
};
// invalid_argument naming dir/trainer_state.json, the field, its value and what was expected, when
// `state` (read by load_train_state) does not belong to the run `expect` describes.
Status check_resumed_state(const std::string& dir, const TrainState& state, const ResumeExpectations& expect);

// "checkpoint-000042" for step 42.
std::string checkpoint_name(int64_t step);

// Writes a trainer's own files (e.g. GRPO's reference weights) into the temporary directory of a
// checkpoint being saved; they appear with the rest, atomically.
using ExtraCheckpointFiles = std::function<Status(const std::string& tmp_dir)>;

// Writes dir (replacing an older one) from the model in source_model_dir (its config.json, with
// torch_dtype "float32", and every small non-weight file), the given tensors and state, and what `extra`
// (may be empty) writes.
Status save_train_checkpoint(const std::string& dir, const std::string& source_model_dir, const ModelParams& params,
                             const ModelParams& m, const ModelParams& v, const TrainState& state,
                             const ExtraCheckpointFiles& extra = nullptr);

// Data parallel with ZeRO (moments sharded over comm's ranks): the same directory, written once, with
// trainer_state.json's "optimizer_shards": N and each rank's moments m [shard], v [shard] of the flat
// buffer (dist::shard_range) in optimizer_shard_name(rank, N) instead of optimizer.safetensors. Every rank
// calls it; rank 0 writes the rest; atomic as one directory: it appears only when every rank's part is
// written. Every rank returns the same outcome.
Status save_sharded_train_checkpoint(dist::Comm& comm, const std::string& dir, const std::string& source_model_dir,
                                     const ModelParams& params, const float* m, const float* v,
                                     const TrainState& state, const ExtraCheckpointFiles& extra = nullptr);
// "optimizer-rank00001-of-00004.safetensors".
std::string optimizer_shard_name(int rank, int size);

// The newest checkpoint directory under out_dir, by its step number ("" when there is none): every
// checkpoint-<digits> directory counts (they appear whole, io/atomic_dir.h), so a newest one that lost its
// trainer_state.json fails its load instead of being passed over.
std::string find_latest_checkpoint(const std::string& out_dir);

// The checkpoint a run writing to out_dir continues from: with resume the newest one ("" when there is
// none or out_dir is ""), else "". invalid_argument when out_dir holds one and neither resume nor force.
Result<std::string> checkpoint_to_resume(const std::string& out_dir, bool resume, bool force);

// A checkpoint's training state in two parts (errors name the file and the tensor): trainer_state.json
// (and the number of optimizer shards it was saved with), and the moments of the flat values `range` of a model shaped like `layout` into m, v [range.size()] each,
// from optimizer.safetensors or from the saved shards (re-sharded: any N reads any N's checkpoint).
// trainer_state.json is checked field by field (a missing file, a non-object, step / cursor / skipped_steps
// not integers ≥ 0, seed not an unsigned integer, options not a string, optimizer_shards outside
// [1, 65536]: invalid_argument naming the file and the field); the moments must be finite and v ≥ 0.
Status load_train_state(const std::string& dir, TrainState& state, int* optimizer_shards);
// Writes dir/trainer_state.json of `state` (not atomic by itself: into a checkpoint's temporary directory),
// with "optimizer_shards" when more than one.
Status write_train_state(const std::string& dir, const TrainState& state, int optimizer_shards = 1);
Status load_moments(const std::string& dir, int optimizer_shards, const ModelParams& layout, dist::Range range,
                    float* m, float* v);

// `params` as an f32 safetensors file with Hugging Face names (e.g. GRPO's ref_model.safetensors, from
// an ExtraCheckpointFiles writer), and read back into params of the same model (errors name the file
// and the tensor; a non-finite value is an error).
Status write_params_safetensors(const std::string& path, const ModelParams& params);
Status read_params_safetensors(const std::string& path, ModelParams& params);
// invalid_argument "<what>: tensor <name> holds a non-finite value (...)" for the first tensor of params
// holding a NaN or an infinity (e.g. the weights of a checkpoint being resumed).
Status check_finite_params(const ModelParams& params, const std::string& what);

}  // namespace dc::train
