// save_train_checkpoint / load_train_state / find_latest_checkpoint.
#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/dream.h"
#include "gguf/model_source.h"
#include "gguf/tokenizer_gguf.h"
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

namespace {

// config.json of source_model_dir (a directory or a dream GGUF) as a training checkpoint's (f32, not
// quantized).
Result<Json> checkpoint_config(const std::string& source_model_dir) {
  DC_ASSIGN_OR_RETURN(Json config, model_source_config_json(source_model_dir));
  config["torch_dtype"] = "float32";
  config.erase("quantization");
  return config;
}

// The source's small files into tmp: a directory's (tokenizer, generation config, ...) copied; a
// GGUF's tokenizer written as tokenizer.json and its chat template as tokenizer_config.json's
// chat_template, so the checkpoint loads, generates and converts back as its source did.
Status copy_source_files(const std::string& tmp, const std::string& source_model_dir) {
  if (is_gguf_path(source_model_dir)) {
    DC_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::open(source_model_dir));
    if (const std::optional<std::string> tmpl = gguf_chat_template(file)) {
      DC_RETURN_IF_ERROR(write_text_file((fs::path(tmp) / "tokenizer_config.json").string(),
                                         Json{{"chat_template", *tmpl}}.dump(2)));
    }
    if (!gguf_has_tokenizer(file)) return Status();
    DC_ASSIGN_OR_RETURN(const std::string json, gguf_tokenizer_json(file));
    return write_text_file((fs::path(tmp) / "tokenizer.json").string(), json);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(source_model_dir, ec)) {
    if (!e.is_regular_file() || is_weight_or_state_file(e.path())) continue;
    fs::copy_file(e.path(), fs::path(tmp) / e.path().filename(), ec);
    if (ec) return io_error("cannot copy " + e.path().string() + " into " + tmp + ": " + ec.message());
  }
  return Status();
}

// Everything of a checkpoint but the optimizer moments, into tmp: the weights, the source's small files,
// trainer_state.json (with optimizer_shards when the moments are sharded), `extra`, config.json.
Status write_model_files(const std::string& tmp, const std::string& source_model_dir, const Json& config,
                         const ModelParams& params, const TrainState& state, int optimizer_shards,
                         const ExtraCheckpointFiles& extra) {
  DC_RETURN_IF_ERROR(write_safetensors((fs::path(tmp) / "model.safetensors").string(), tensors_of(params, ""),
                                       {{"format", "pt"}}));
  DC_RETURN_IF_ERROR(copy_source_files(tmp, source_model_dir));
  Json st = {{"step", state.step}, {"cursor", state.cursor}, {"seed", state.seed}, {"options", state.options}};
  if (optimizer_shards > 1) st["optimizer_shards"] = optimizer_shards;
  DC_RETURN_IF_ERROR(write_text_file((fs::path(tmp) / "trainer_state.json").string(), st.dump(2) + "\n"));
  if (extra) DC_RETURN_IF_ERROR(extra(tmp));
  return write_text_file((fs::path(tmp) / "config.json").string(), config.dump(2) + "\n");
}

Status write_moment_shard(const std::string& tmp, int rank, int size, dist::Range shard, const float* m,
                          const float* v) {
  const std::vector<int64_t> shape = {shard.size()};
  return write_safetensors((fs::path(tmp) / optimizer_shard_name(rank, size)).string(),
                           {{"m", DType::kF32, shape, m}, {"v", DType::kF32, shape, v}},
                           {{"begin", std::to_string(shard.begin)}, {"end", std::to_string(shard.end)}});
}

}  // namespace

std::string optimizer_shard_name(int rank, int size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "optimizer-rank%05d-of-%05d.safetensors", rank, size);
  return buf;
}

Status save_train_checkpoint(const std::string& dir, const std::string& source_model_dir, const ModelParams& params,
                             const ModelParams& m, const ModelParams& v, const TrainState& state,
                             const ExtraCheckpointFiles& extra) {
  DC_ASSIGN_OR_RETURN(const Json config, checkpoint_config(source_model_dir));
  return write_dir_atomically(dir, /*replace=*/true, [&](const std::string& tmp) -> Status {
    std::vector<TensorToWrite> moments = tensors_of(m, "m.");
    for (auto& t : tensors_of(v, "v.")) moments.push_back(std::move(t));
    DC_RETURN_IF_ERROR(write_safetensors((fs::path(tmp) / "optimizer.safetensors").string(), moments));
    return write_model_files(tmp, source_model_dir, config, params, state, 1, extra);
  });
}

// Rank 0 runs write_dir_atomically; its temporary directory's name goes to every rank (empty: rank 0
// could not create it), each writes its part there and the outcomes are agreed on (summed over the
// ranks). Only when every part is written does rank 0 rename the directory and send every rank whether
// the rename succeeded; else each rank returns its own error or the other ranks' failure, and rank 0's
// write_dir_atomically removes the temporary directory: no partial checkpoint. Every rank takes part in
// the same collectives in the same order whatever fails (a dead rank stops the job before the rename).
Status save_sharded_train_checkpoint(dist::Comm& comm, const std::string& dir, const std::string& source_model_dir,
                                     const ModelParams& params, const float* m, const float* v,
                                     const TrainState& state, const ExtraCheckpointFiles& extra) {
  const dist::Range shard = dist::shard_range(params.n_values(), comm.rank(), comm.size());
  // Every rank's outcome of its part; 0 = ok. Gathered so that all ranks agree.
  auto agree = [&](const Status& mine) -> Status {
    DC_ASSIGN_OR_RETURN(std::vector<double> failed, comm.sum_doubles({mine.ok() ? 0.0 : 1.0}));
    if (!mine.ok()) return mine;
    if (failed[0] > 0)
      return io_error("checkpoint " + dir + ": not written: another rank could not write its part (see its message)");
    return Status();
  };
  if (comm.rank() != 0) {
    std::string tmp;
    DC_RETURN_IF_ERROR(comm.broadcast_string(tmp, 0));
    if (tmp.empty()) return io_error("checkpoint " + dir + ": not written: rank 0 could not create it (see its message)");
    DC_RETURN_IF_ERROR(agree(write_moment_shard(tmp, comm.rank(), comm.size(), shard, m, v)));
    double renamed = 0;
    DC_RETURN_IF_ERROR(comm.broadcast(&renamed, sizeof(renamed), 0));
    return renamed == 1 ? Status()
                        : io_error("checkpoint " + dir + ": not written: rank 0 could not finish it (see its message)");
  }
  bool announced = false, agreed = false;
  Result<Json> source_config = checkpoint_config(source_model_dir);
  Status status = source_config.status();
  if (status.ok()) {
    const Json& config = *source_config;
    status = write_dir_atomically(dir, /*replace=*/true, [&](const std::string& tmp) -> Status {
      std::string name = tmp;
      announced = true;
      DC_RETURN_IF_ERROR(comm.broadcast_string(name, 0));
      Status mine = write_model_files(tmp, source_model_dir, config, params, state, comm.size(), extra);
      if (mine.ok()) mine = write_moment_shard(tmp, 0, comm.size(), shard, m, v);
      DC_RETURN_IF_ERROR(agree(mine));
      agreed = true;
      return Status();
    });
  }
  if (!announced) {
    std::string none;
    DC_RETURN_IF_ERROR(comm.broadcast_string(none, 0));
    return status;
  }
  if (!agreed) return status;  // every rank knows from the agreement: nothing was renamed
  double renamed = status.ok() ? 1 : 0;
  DC_RETURN_IF_ERROR(comm.broadcast(&renamed, sizeof(renamed), 0));
  return status;
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

Status load_train_state(const std::string& dir, TrainState& state, int* optimizer_shards) {
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  DC_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  try {
    const Json j = Json::parse(text);
    state.step = j.at("step").get<int64_t>();
    state.cursor = j.at("cursor").get<int64_t>();
    state.seed = j.at("seed").get<uint64_t>();
    state.options = j.at("options").get<std::string>();
    *optimizer_shards = j.value("optimizer_shards", 1);
  } catch (const std::exception& e) {
    return parse_error(state_path + ": " + e.what());
  }
  if (*optimizer_shards < 1) return parse_error(state_path + ": optimizer_shards must be at least 1");
  return Status();
}

Status load_moments(const std::string& dir, int optimizer_shards, const ModelParams& layout, dist::Range range,
                    float* m, float* v) {
  if (optimizer_shards == 1) {  // optimizer.safetensors: m.<name> and v.<name> per tensor
    DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string()));
    for (const auto& t : layout.tensors()) {
      const int64_t lo = std::max(range.begin, t.offset), hi = std::min(range.end, t.offset + t.size);
      if (lo >= hi) continue;
      for (const auto& [prefix, out] : {std::pair<const char*, float*>{"m.", m}, {"v.", v}}) {
        const TensorInfo* info = file.find(prefix + t.name);
        if (info == nullptr) return invalid_argument(file.path() + ": no tensor " + prefix + t.name);
        if (info->dtype != DType::kF32 || info->shape != t.shape)
          return invalid_argument(file.path() + ": " + prefix + t.name + " is not f32 of the model's shape");
        std::memcpy(out + (lo - range.begin), reinterpret_cast<const float*>(info->data) + (lo - t.offset),
                    static_cast<size_t>(hi - lo) * sizeof(float));
      }
    }
    return Status();
  }
  for (int r = 0; r < optimizer_shards; ++r) {  // re-sharded: the parts of the saved shards in `range`
    const dist::Range saved = dist::shard_range(layout.n_values(), r, optimizer_shards);
    const int64_t lo = std::max(range.begin, saved.begin), hi = std::min(range.end, saved.end);
    if (lo >= hi) continue;
    DC_ASSIGN_OR_RETURN(SafetensorsFile file,
                        SafetensorsFile::open((fs::path(dir) / optimizer_shard_name(r, optimizer_shards)).string()));
    for (const auto& [name, out] : {std::pair<const char*, float*>{"m", m}, {"v", v}}) {
      const TensorInfo* info = file.find(name);
      if (info == nullptr || info->dtype != DType::kF32 || info->shape != std::vector<int64_t>{saved.size()})
        return invalid_argument(file.path() + ": no f32 tensor " + name + " of " + std::to_string(saved.size()) +
                                " values (the shard of rank " + std::to_string(r) + " of " +
                                std::to_string(optimizer_shards) + " of this model)");
      std::memcpy(out + (lo - range.begin), reinterpret_cast<const float*>(info->data) + (lo - saved.begin),
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
  }
  return Status();
}

Status write_params_safetensors(const std::string& path, const ModelParams& params) {
  return write_safetensors(path, tensors_of(params, ""), {{"format", "pt"}});
}

Status read_params_safetensors(const std::string& path, ModelParams& params) {
  DC_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  return read_into(file, "", params);
}

}  // namespace dc::train
