// convert_checkpoint: a quantized copy of a checkpoint directory (`diffucoder convert`).
#include "model/convert.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_dir.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "model/weight_cache.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// One source tensor and what convert writes for it.
struct Item {
  const TensorInfo* src = nullptr;
  bool quantize = false;
  size_t out_bytes = 0;
};

size_t quantized_bytes(int64_t rows, int64_t cols, const QuantizeOptions& o) {
  if (o.format == WeightQuant::kQ8) return static_cast<size_t>(rows * cols + 4 * rows);
  return static_cast<size_t>(rows * cols / 2 + 4 * rows * (cols / o.group_size));
}

bool is_weight_file(const fs::path& p) {
  static const std::set<std::string> kExt = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack"};
  const std::string name = p.filename().string();
  return kExt.count(p.extension().string()) > 0 || name.find(".safetensors") != std::string::npos ||
         name == "pytorch_model.bin.index.json" || name == "config.json";  // (also stale *.safetensors.tmp.*)
}


Status write_config(const std::string& model_dir, const std::string& dir, const QuantizeOptions& o) {
  const std::string src = (fs::path(model_dir) / "config.json").string();
  DC_ASSIGN_OR_RETURN(std::string text, read_text_file(src));
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    return parse_error(src + ": not valid JSON (" + e.what() + ")");
  }
  if (o.format != WeightQuant::kNone)
    j["quantization"] = {{"format", quant_format_name(o.format)},
                         {"group_size", o.format == WeightQuant::kQ4 ? o.group_size : 0},
                         {"quantized_by", "diffucoder"}};
  return write_text_file((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
}

Status convert_into(const ConvertOptions& opt, const Checkpoint& ckpt, const std::string& tmp, ThreadPool* pool) {
  const ModelConfig& config = ckpt.config();
  // Which tensors are matrices of the model (and so candidates for quantization).
  std::map<std::string, std::vector<int64_t>> matrices;
  ModelWeights scratch;
  visit_weights(config, scratch, [&](const WeightSlot& slot) {
    if (slot.matrix != nullptr) matrices[slot.name] = slot.shape;
  });
  std::vector<Item> items;
  for (const auto& [name, source] : ckpt.tensors()) {
    const auto replaced = opt.replacements.find(name);
    const TensorInfo& t = replaced == opt.replacements.end() ? source : replaced->second;
    if (t.dtype != source.dtype || t.shape != source.shape)
      return invalid_argument("convert: the replacement of '" + name + "' differs from the source's dtype or shape");
    Item item{&t, false, t.n_bytes};
    auto m = matrices.find(name);
    if (m != matrices.end() && should_quantize(name, m->second[1], opt.quantize)) {
      item.quantize = true;
      item.out_bytes = quantized_bytes(m->second[0], m->second[1], opt.quantize);
    }
    items.push_back(item);
  }
  // Shards: consecutive items up to shard_bytes each.
  std::vector<std::vector<size_t>> shards(1);
  size_t in_shard = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (in_shard > 0 && in_shard + items[i].out_bytes > opt.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += items[i].out_bytes;
  }
  const auto start = std::chrono::steady_clock::now();
  Json weight_map = Json::object();
  size_t total_size = 0;
  int64_t done = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    char shard_name[64];
    if (shards.size() == 1) {
      std::snprintf(shard_name, sizeof shard_name, "model.safetensors");
    } else {
      std::snprintf(shard_name, sizeof shard_name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    }
    std::vector<QuantizedMatrix> held;
    held.reserve(shards[s].size());
    std::vector<TensorToWrite> tensors;
    for (size_t i : shards[s]) {
      const TensorInfo& t = *items[i].src;
      const char* action = "copy";
      if (items[i].quantize) {
        const WeightView dense{t.dtype, t.data, t.shape[0], t.shape[1]};
        auto q = quantize_matrix(dense, opt.quantize, t.name, pool);
        if (!q.ok()) return q.status().with_context("converting " + t.file);
        held.push_back(std::move(q).value());
        const QuantizedMatrix& m = held.back();
        const bool q4 = opt.quantize.format == WeightQuant::kQ4;
        const int64_t rows = t.shape[0], cols = t.shape[1];
        if (q4) {
          tensors.push_back({t.name, DType::kU8, {rows, cols / 2}, m.codes.data()});
          tensors.push_back({quant_scale_name(t.name), DType::kF16, {rows, cols / opt.quantize.group_size},
                             m.scales_f16.data()});
          tensors.push_back({quant_min_name(t.name), DType::kF16, {rows, cols / opt.quantize.group_size},
                             m.mins_f16.data()});
        } else {
          tensors.push_back({t.name, DType::kI8, {rows, cols}, m.codes.data()});
          tensors.push_back({quant_scale_name(t.name), DType::kF32, {rows}, m.scales_f32.data()});
        }
        action = quant_format_name(opt.quantize.format);
      } else {
        tensors.push_back({t.name, t.dtype, t.shape, t.data});
      }
      ++done;
      if (opt.on_tensor) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        opt.on_tensor({done, static_cast<int64_t>(items.size()), t.name, action, t.n_bytes, items[i].out_bytes, secs});
      }
    }
    for (const TensorToWrite& t : tensors) weight_map[t.name] = shard_name;
    for (size_t i : shards[s]) total_size += items[i].out_bytes;
    std::map<std::string, std::string> metadata = {{"format", "pt"}};
    if (opt.quantize.format != WeightQuant::kNone) metadata["quantization"] = quant_format_name(opt.quantize.format);
    DC_RETURN_IF_ERROR(write_safetensors((fs::path(tmp) / shard_name).string(), tensors, metadata));
  }
  if (shards.size() > 1) {
    const Json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    DC_RETURN_IF_ERROR(write_text_file((fs::path(tmp) / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  // The small files: generation config, tokenizer, chat template, license, ...
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(opt.model_dir, ec)) {
    if (!e.is_regular_file() || is_weight_file(e.path()) || is_weight_cache_file_name(e.path().filename().string()))
      continue;  // packed-weight caches belong to the source's weights
    fs::copy_file(e.path(), fs::path(tmp) / e.path().filename(), ec);
    if (ec) return io_error("cannot copy " + e.path().string() + " to " + tmp + ": " + ec.message());
  }
  if (ec) return io_error("cannot list " + opt.model_dir + ": " + ec.message());
  return write_config(opt.model_dir, tmp, opt.quantize);  // last: a directory without it does not load
}

}  // namespace

Status convert_checkpoint(const ConvertOptions& opt, ThreadPool* pool) {
  // An unquantized copy (format kNone) only as a carrier of replacements (`convert --lora`).
  if (opt.quantize.format != WeightQuant::kNone || opt.replacements.empty())
    DC_RETURN_IF_ERROR(check_quantize_options(opt.quantize));
  if (opt.out_dir.empty()) return invalid_argument("--out must name the directory to write");
  std::error_code ec;
  const fs::path out = fs::path(opt.out_dir).lexically_normal();
  if (fs::exists(out, ec) && !opt.force)
    return invalid_argument("output directory '" + opt.out_dir + "' already exists; pass --force to replace it");
  if (fs::exists(opt.model_dir, ec) && fs::exists(out, ec) && fs::equivalent(opt.model_dir, out, ec))
    return invalid_argument("--out '" + opt.out_dir + "' is the model directory itself; choose another directory");
  DC_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(opt.model_dir));
  const QuantizationConfig& existing = ckpt.config().quantization;
  if (existing.format != WeightQuant::kNone)
    return invalid_argument(opt.model_dir + " is already quantized (" + quant_format_name(existing.format) +
                            "); convert the original bf16 checkpoint");
  {  // every tensor of the model present with the shape config.json implies
    VectorStore vectors(ckpt.config());
    auto bound = bind_weights(ckpt, ckpt.config(), vectors);
    if (!bound.ok()) return bound.status();
  }
  // Everything goes to a temporary directory renamed into place at the end (io/atomic_dir.h).
  return write_dir_atomically(opt.out_dir, opt.force,
                              [&](const std::string& tmp) { return convert_into(opt, ckpt, tmp, pool); });
}

}  // namespace dc
