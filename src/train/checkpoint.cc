// save_train_checkpoint / load_train_state / find_latest_checkpoint.
#include "train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
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
  return check_finite_params(p, file.path());
}

// The index of the first value of x [n] that is not finite (or, with non_negative, below 0); -1 if none.
int64_t first_bad_value(const float* x, int64_t n, bool non_negative) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]) || (non_negative && x[i] < 0)) return i;
  return -1;
}

// A moment read from `path` (tensor `name`, values [begin, begin + n) of it): finite, and v ≥ 0.
Status check_moment(const std::string& path, const std::string& name, const float* x, int64_t n, int64_t begin,
                    bool is_v) {
  const int64_t bad = first_bad_value(x, n, is_v);
  if (bad < 0) return Status();
  return invalid_argument(path + ": tensor " + name + " holds " + std::to_string(x[bad]) + " at index " +
                          std::to_string(begin + bad) + (is_v ? "; the second moments must be finite and >= 0"
                                                              : "; the first moments must be finite") +
                          " (a damaged or edited checkpoint: resume from an older one, or pass --force to start over)");
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
  DC_RETURN_IF_ERROR(write_train_state(tmp, state, optimizer_shards));
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
  int64_t best_step = -1;
  for (const auto& e : fs::directory_iterator(out_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("checkpoint-", 0) != 0) continue;
    const std::string digits = name.substr(11);  // temporary ".tmp.<pid>" / ".old.<pid>" directories are not
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const int64_t step = std::stoll(digits);
    if (step > best_step) best_step = step, best = e.path().string();
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

namespace {

constexpr int64_t kMaxStateFileBytes = int64_t{1} << 20;  // trainer_state.json holds a few hundred bytes
constexpr int64_t kMaxOptimizerShards = int64_t{1} << 16;

// "<path>: field '<key>' ..." with the hint every trainer_state.json error ends with.
Status bad_state(const std::string& path, const std::string& what) {
  return invalid_argument(path + ": " + what + " (the file was edited or damaged: restore it, resume from an older "
                          "checkpoint, or pass --force to start over)");
}

// An integer field in [lo, hi] (JSON integers only: 3.0, "3", true are refused).
Result<int64_t> int_field(const Json& j, const std::string& path, const char* key, int64_t lo, int64_t hi, bool required,
                          int64_t fallback) {
  if (!j.contains(key)) {
    if (required) return bad_state(path, std::string("field '") + key + "' is missing");
    return fallback;
  }
  const Json& v = j[key];
  const bool in_range =
      v.is_number_unsigned()
          ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) && (lo <= 0 || v.get<uint64_t>() >= static_cast<uint64_t>(lo))
          : v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  if (!in_range)
    return bad_state(path, std::string("field '") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                               std::to_string(hi) + "], got " + v.dump());
  return v.get<int64_t>();
}

}  // namespace

Status load_train_state(const std::string& dir, TrainState& state, int* optimizer_shards) {
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(state_path, ec))
    return invalid_argument(state_path + " is missing: " + dir + " is not a complete checkpoint (remove it to resume "
                            "from an older one, or pass --force to start over)");
  const auto size = fs::file_size(state_path, ec);
  if (ec || size > static_cast<uintmax_t>(kMaxStateFileBytes))
    return bad_state(state_path, "larger than " + std::to_string(kMaxStateFileBytes) + " bytes");
  DC_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    return bad_state(state_path, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) return bad_state(state_path, "not a JSON object");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  DC_ASSIGN_OR_RETURN(state.step, int_field(j, state_path, "step", 0, kMax, true, 0));
  DC_ASSIGN_OR_RETURN(state.cursor, int_field(j, state_path, "cursor", 0, kMax, true, 0));
  DC_ASSIGN_OR_RETURN(state.skipped_steps, int_field(j, state_path, "skipped_steps", 0, state.step, false, 0));
  DC_ASSIGN_OR_RETURN(const int64_t shards, int_field(j, state_path, "optimizer_shards", 1, kMaxOptimizerShards, false, 1));
  *optimizer_shards = static_cast<int>(shards);
  if (!j.contains("seed") || !j["seed"].is_number_unsigned())
    return bad_state(state_path, "field 'seed' must be an integer in [0, 2^64), got " +
                                     (j.contains("seed") ? j["seed"].dump() : std::string("nothing")));
  state.seed = j["seed"].get<uint64_t>();
  if (!j.contains("options") || !j["options"].is_string())
    return bad_state(state_path, "field 'options' must be a string (the run's options)");
  state.options = j["options"].get<std::string>();
  return Status();
}

Status write_train_state(const std::string& dir, const TrainState& state, int optimizer_shards) {
  Json st = {{"step", state.step}, {"cursor", state.cursor}, {"seed", state.seed}, {"options", state.options}};
  if (optimizer_shards > 1) st["optimizer_shards"] = optimizer_shards;
  if (state.skipped_steps > 0) st["skipped_steps"] = state.skipped_steps;
  return write_text_file((fs::path(dir) / "trainer_state.json").string(), st.dump(2) + "\n");
}

Status check_resumed_state(const std::string& dir, const TrainState& state, const ResumeExpectations& e) {
  const std::string path = (fs::path(dir) / "trainer_state.json").string();
  if (state.step > e.total_steps)
    return bad_state(path, "field 'step' is " + std::to_string(state.step) + ", beyond the run's " +
                               std::to_string(e.total_steps) + " steps");
  if (state.step % e.steps_per_round != 0)
    return bad_state(path, "field 'step' is " + std::to_string(state.step) + ", not a multiple of the " +
                               std::to_string(e.steps_per_round) + " steps of a round (checkpoints end rounds)");
  int64_t cursor = 0;
  if (__builtin_mul_overflow(state.step / e.steps_per_round, e.samples_per_round, &cursor) || state.cursor != cursor)
    return bad_state(path, "field 'cursor' is " + std::to_string(state.cursor) + "; after " +
                               std::to_string(state.step) + " steps of this run it must be " + std::to_string(cursor) +
                               " (samples consumed)");
  if (state.seed != e.seed)
    return bad_state(path, "field 'seed' is " + std::to_string(state.seed) + "; the run's --seed is " +
                               std::to_string(e.seed));
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
        DC_RETURN_IF_ERROR(check_moment(file.path(), prefix + t.name, out + (lo - range.begin), hi - lo, lo - t.offset,
                                        out == v));
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
      DC_RETURN_IF_ERROR(check_moment(file.path(), name, out + (lo - range.begin), hi - lo, lo - saved.begin, out == v));
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

Status check_finite_params(const ModelParams& params, const std::string& what) {
  for (const auto& t : params.tensors()) {
    const int64_t bad = first_bad_value(t.data, t.size, false);
    if (bad >= 0)
      return invalid_argument(what + ": tensor " + t.name + " holds " + std::to_string(t.data[bad]) + " at index " +
                              std::to_string(bad) + " (weights must be finite: a damaged checkpoint, or one saved "
                              "after a diverged run)");
  }
  return Status();
}

}  // namespace dc::train
