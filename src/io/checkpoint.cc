// Checkpoint directory loading: config files, then one safetensors file or the shards of an index.
#include "io/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "io/config_json.h"
#include "io/mapped_file.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

bool file_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// A shard name must stay inside the checkpoint directory.
bool is_plain_relative(const std::string& name) {
  const fs::path p(name);
  if (name.empty() || p.is_absolute()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found("checkpoint directory '" + dir + "' does not exist or is not a directory");
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  const std::string config_path = join(dir, "config.json");
  if (!file_exists(config_path)) {
    return not_found("no config.json in " + dir + "; is this a Hugging Face model directory?");
  }
  DC_ASSIGN_OR_RETURN(ckpt.config_, load_model_config(config_path));
  const std::string gen_path = join(dir, "generation_config.json");
  if (file_exists(gen_path)) {
    DC_ASSIGN_OR_RETURN(ckpt.generation_config_, load_generation_config(gen_path));
  }
  const std::string single_path = join(dir, "model.safetensors");
  const std::string index_path = join(dir, "model.safetensors.index.json");
  if (file_exists(single_path)) {
    DC_RETURN_IF_ERROR(ckpt.load_single(single_path));
  } else if (file_exists(index_path)) {
    DC_RETURN_IF_ERROR(ckpt.load_sharded(index_path));
  } else {
    return not_found("no model.safetensors or model.safetensors.index.json in " + dir +
                     "; download the weights (only safetensors checkpoints are supported)");
  }
  return ckpt;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

Status Checkpoint::load_single(const std::string& path) {
  DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  files_.push_back(std::move(file));
  return add_tensors(files_.back());
}

Status Checkpoint::add_tensors(const SafetensorsFile& file) {
  for (const auto& [name, info] : file.tensors()) {
    auto [it, inserted] = tensors_.emplace(name, info);
    if (!inserted) {
      return invalid_argument("tensor '" + name + "' is in both " + it->second.file + " and " + file.path() +
                              "; remove the stale shard or fix model.safetensors.index.json");
    }
    total_bytes_ += info.n_bytes;
  }
  return Status::ok_status();
}

Status Checkpoint::load_sharded(const std::string& index_path) {
  DC_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  Json index;
  try {
    index = Json::parse(text);
  } catch (const std::exception& e) {
    return parse_error(index_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!index.is_object()) return parse_error(index_path + ": must hold a JSON object with a \"weight_map\"");
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return parse_error(index_path + ": field \"weight_map\" must be an object {tensor name: shard file name}");
  }
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> the tensors the index puts there
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string() || !is_plain_relative(shard.get<std::string>())) {
      return parse_error(index_path + ": \"weight_map\" entry for tensor '" + name +
                         "' must be the file name of a shard inside the checkpoint directory");
    }
    by_shard[shard.get<std::string>()].push_back(name);
  }
  if (by_shard.empty()) return parse_error(index_path + ": \"weight_map\" is empty; the index lists no tensors");
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = join(dir_, shard);
    if (!file_exists(shard_path)) {
      return not_found(index_path + " names shard " + shard + " (for tensor '" + names.front() +
                       "'), which is missing from " + dir_ + "; finish the download");
    }
    DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(shard_path));
    for (const std::string& name : names) {
      if (file.find(name) == nullptr) {
        return not_found(index_path + " puts tensor '" + name + "' in " + shard_path +
                         ", which does not contain it; the index and the shards disagree");
      }
    }
    files_.push_back(std::move(file));
    DC_RETURN_IF_ERROR(add_tensors(files_.back()));
  }
  return Status::ok_status();
}

}  // namespace dc
