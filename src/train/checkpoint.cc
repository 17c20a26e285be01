// save_train_checkpoint / load_train_state / find_latest_checkpoint.
#include "train/checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/atomic_dir.h"
#include "io/safetensors.h"

namespace dc::train {
namespace fs = std::filesystem;
using Json = nlohmann::json;
namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_weight_or_state_file(const fs::path& p) {
  const std::string name = p.filename().string(), ext = p.extension().string();
  return ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf" ||
         name == "model.safetensors.index.json" || name == "config.json" || name == "trainer_state.json" ||
         name == "metrics.jsonl" || name.find(".tmp.") != std::string::npos;
}

std::vector<TensorToWrite> tensors_of(const ModelParams& p, const std::string& prefix) {
  std::vector<TensorToWrite> out;
  for (const auto& t : p.tensors()) out.push_back({prefix + t.name, DType::kF32, t.shape, t.data});
  return out;
}

Status read_into(const SafetensorsFile& file, const std::string& prefix, ModelParams& p) {
  for (const auto& t : p.tensors()) {
    const TensorInfo* info = file.find(prefix + t.name);
    if (info == nullptr) return invalid_argument(file.path() + ": no tensor " + prefix + t.name);
    if (info->dtype != DType::kF32 || info->shape != t.shape)
      return invalid_argument(file.path() + ": " + prefix + t.name + " is not f32 of the model's shape");
    std::memcpy(t.data, info->data, t.size * sizeof(float));
  }
  return Status();
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "checkpoint-%06lld", static_cast<long long>(step));
  return buf;
}

Status save_train_checkpoint(const std::string& dir, const std::string& source_model_dir, const ModelParams& params,
                             const ModelParams& m, const ModelParams& v, const TrainState& state,
                             const ExtraCheckpointFiles& extra) {
  const std::string config_path = (fs::path(source_model_dir) / "config.json").string();
  DC_ASSIGN_OR_RETURN(std::string config_text, read_file(config_path));
  Json config;
  try {
    config = Json::parse(config_text);
  } catch (const std::exception& e) {
    return parse_error(config_path + ": not valid JSON (" + e.what() + ")");
  }
  config["torch_dtype"] = "float32";
  config.erase("quantization");
  return write_dir_atomically(dir, /*replace=*/true, [&](const std::string& tmp) -> Status {
    DC_RETURN_IF_ERROR(write_safetensors((fs::path(tmp) / "model.safetensors").string(), tensors_of(params, ""),
                                         {{"format", "pt"}}));
    std::vector<TensorToWrite> moments = tensors_of(m, "m.");
    for (auto& t : tensors_of(v, "v.")) moments.push_back(std::move(t));
    DC_RETURN_IF_ERROR(write_safetensors((fs::path(tmp) / "optimizer.safetensors").string(), moments));
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(source_model_dir, ec)) {
      if (!e.is_regular_file() || is_weight_or_state_file(e.path())) continue;
      fs::copy_file(e.path(), fs::path(tmp) / e.path().filename(), ec);
      if (ec) return io_error("cannot copy " + e.path().string() + " into " + tmp + ": " + ec.message());
    }
    const Json st = {{"step", state.step}, {"cursor", state.cursor}, {"seed", state.seed}, {"options", state.options}};
    DC_RETURN_IF_ERROR(write_text_file((fs::path(tmp) / "trainer_state.json").string(), st.dump(2) + "\n"));
    if (extra) DC_RETURN_IF_ERROR(extra(tmp));
    return write_text_file((fs::path(tmp) / "config.json").string(), config.dump(2) + "\n");
  });
}

std::string find_latest_checkpoint(const std::string& out_dir) {
  std::error_code ec;
  std::string best;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("checkpoint-", 0) != 0 || name.find('.') != std::string::npos) continue;
    if (!fs::exists(e.path() / "trainer_state.json", ec)) continue;
    if (best.empty() || name > fs::path(best).filename().string()) best = e.path().string();
  }
  return best;
}

Result<std::string> checkpoint_to_resume(const std::string& out_dir, bool resume, bool force) {
  std::error_code ec;
  const std::string latest = !out_dir.empty() && fs::exists(out_dir, ec) ? find_latest_checkpoint(out_dir) : "";
  if (!latest.empty() && !resume && !force)
    return invalid_argument("--out '" + out_dir + "' already holds " + latest +
                            "; pass --resume to continue it or --force to start over");
  return resume ? latest : std::string();
}

Status load_train_state(const std::string& dir, ModelParams& m, ModelParams& v, TrainState& state) {
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  DC_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  try {
    const Json j = Json::parse(text);
    state.step = j.at("step").get<int64_t>();
    state.cursor = j.at("cursor").get<int64_t>();
    state.seed = j.at("seed").get<uint64_t>();
    state.options = j.at("options").get<std::string>();
  } catch (const std::exception& e) {
    return parse_error(state_path + ": " + e.what());
  }
  DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string()));
  DC_RETURN_IF_ERROR(read_into(file, "m.", m));
  return read_into(file, "v.", v);
}

Status write_params_safetensors(const std::string& path, const ModelParams& params) {
  return write_safetensors(path, tensors_of(params, ""), {{"format", "pt"}});
}

Status read_params_safetensors(const std::string& path, ModelParams& params) {
  DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  return read_into(file, "", params);
}

}  // namespace dc::train
