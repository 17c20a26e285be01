// Checkpoint: a Hugging Face model directory (config.json, optional generation_config.json, and
// model.safetensors or sharded model-*.safetensors with model.safetensors.index.json) as one
// name -> tensor source. The weights stay memory-mapped; nothing is copied.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "types/model_config.h"

namespace dc {

class Checkpoint {
 public:
  // Opens the checkpoint in `dir`: config.json is required and validated (io/config_json.h);
  // generation_config.json is read when present (else generation_config().present is false). Weights
  // come from dir/model.safetensors when it exists, else from the shards listed in the "weight_map" of
  // dir/model.safetensors.index.json: each shard (a file name inside `dir`) is opened once, every
  // tensor the index names must be in the shard it names, and a tensor found in two shards is an
  // error. Tensors of a shard that the index does not list are kept (as transformers does). Neither
  // file gives kNotFound "no model.safetensors or model.safetensors.index.json in DIR". Tensor names
  // and shapes are not checked against the config here: the model layer does that.
  // An opened Checkpoint is immutable: its const methods may be called from any thread.
  static Result<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const GenerationConfigFile& generation_config() const { return generation_config_; }
  // All tensors by name; their data pointers are valid while this Checkpoint lives (moves keep them).
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // nullptr when no tensor is called `name`.
  const TensorInfo* find(std::string_view name) const;
  // Sum of the tensors' n_bytes.
  size_t total_bytes() const { return total_bytes_; }
  // The safetensors files that back the tensors (one, or one per shard).
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  Status load_single(const std::string& path);
  Status load_sharded(const std::string& index_path);
  Status add_tensors(const SafetensorsFile& file);

  std::string dir_;
  ModelConfig config_;
  GenerationConfigFile generation_config_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, TensorInfo> tensors_;
  size_t total_bytes_ = 0;
};

}  // namespace dc
