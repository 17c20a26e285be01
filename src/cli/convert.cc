// `diffucoder convert --model DIR --out DIR2 --weights q8|q4 [--group-size 128] [--lora ADAPTER] [--force]`:
// writes a quantized copy of a checkpoint (with --lora, the adapter merged first; without --weights then, the
// dtypes kept) (formats in README.md "Quantized weights"); `--out FILE.gguf --weights TYPE` (kGgufTypes: f32 ...
// q6_k) writes a GGUF of architecture dream instead (gguf/writer.h). Progress on stderr.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/dream.h"
#include "gguf/writer.h"
#include "lora/merge.h"
#include "model/convert.h"

namespace dc::cli {
namespace {

struct ConvertArgs {
  std::string model_dir, out_dir, weights, lora;
  int64_t group_size = 128;
  bool force = false, keep_embeddings = false, quiet = false;
  int threads = 0;
  int64_t shard_mb = 2048;
};

// "12.3 s", or "45 ms" under a second.
std::string duration_text(double seconds) {
  char buf[32];
  if (seconds >= 1.0) std::snprintf(buf, sizeof(buf), "%.1f s", seconds);
  else std::snprintf(buf, sizeof(buf), "%.0f ms", seconds * 1e3);
  return buf;
}

// The --weights of a GGUF output (llama.cpp's type names, lower case).
constexpr std::pair<const char*, GgufWeights> kGgufTypes[] = {
    {"f32", GgufWeights::kF32},   {"f16", GgufWeights::kF16},   {"bf16", GgufWeights::kBF16},
    {"q8_0", GgufWeights::kQ8_0}, {"q4_0", GgufWeights::kQ4_0}, {"q4_1", GgufWeights::kQ4_1},
    {"q5_0", GgufWeights::kQ5_0}, {"q5_1", GgufWeights::kQ5_1}, {"q2_k", GgufWeights::kQ2_K},
    {"q3_k", GgufWeights::kQ3_K}, {"q4_k", GgufWeights::kQ4_K}, {"q5_k", GgufWeights::kQ5_K},
    {"q6_k", GgufWeights::kQ6_K}};

// "f32, f16, ..., q5_k or q6_k".
std::string gguf_type_list() {
  std::string list;
  const size_t n = std::size(kGgufTypes);
  for (size_t i = 0; i < n; ++i) list += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kGgufTypes[i].first;
  return list;
}

int run_convert_gguf(const ConvertArgs& args) {
  GgufConvertOptions opt;
  bool known = false;
  for (const auto& [name, type] : kGgufTypes)
    if (args.weights == name) opt.weights = type, known = true;
  if (!known)
    return usage_error(invalid_argument("--weights " + args.weights + ": a GGUF output (--out " + args.out_dir +
                                        ") takes " + gguf_type_list()));
  std::error_code ec;
  if (std::filesystem::exists(args.out_dir, ec) && !args.force)
    return usage_error(invalid_argument("--out " + args.out_dir + " exists; pass --force to replace it"));
  opt.model_dir = args.model_dir;
  opt.out_path = args.out_dir;
  if (!args.quiet)
    opt.on_tensor = [](int64_t i, int64_t n, const std::string& name, const char* type) {
      std::fprintf(stderr, "[%4lld/%lld] %-32s %s\n", (long long)i, (long long)n, name.c_str(), type);
    };
  ThreadPool pool(args.threads);
  if (const Status s = convert_to_gguf(opt, &pool); !s.ok()) return report(s);
  if (!args.quiet) std::fprintf(stderr, "wrote %s (GGUF, architecture dream, %s)\n", args.out_dir.c_str(), args.weights.c_str());
  return 0;
}

// --lora: the base loaded and merged (lora/merge.h); the merged matrices, in the base's dtype, become
// opt's replacements. *merged keeps their memory.
Status merge_for_convert(const ConvertArgs& args, ConvertOptions& opt, std::unique_ptr<Model>* merged, ThreadPool* pool) {
  DC_ASSIGN_OR_RETURN(std::unique_ptr<Model> base, Model::load(args.model_dir));
  if (base->config().quantization.format != WeightQuant::kNone)
    return invalid_argument("--lora: " + args.model_dir + " is quantized; merge into the float checkpoint it was "
                            "converted from (then quantize with --weights q8 | q4)");
  LoraMergeReport report;
  DC_ASSIGN_OR_RETURN(*merged, load_lora_merged(std::move(base), args.lora, pool, &report));
  const ModelConfig config = (*merged)->config();
  ModelWeights w = (*merged)->weights();
  const std::set<std::string> changed(report.changed.begin(), report.changed.end());
  visit_weights(config, w, [&](const WeightSlot& slot) {
    if (slot.matrix == nullptr || !changed.count(slot.name)) return;
    const WeightView& m = *slot.matrix;
    const size_t bytes = static_cast<size_t>(m.rows * m.cols) * dtype_size(m.dtype);
    opt.replacements[slot.name] = TensorInfo{slot.name, m.dtype, slot.shape, m.data, bytes, args.lora + " (merged)"};
  });
  if (!args.quiet)
    std::fprintf(stderr, "merged %s: %lld matrices updated, %lld replaced whole\n", args.lora.c_str(),
                 (long long)report.n_updates, (long long)report.n_replacements);
  return Status();
}

int run_convert(const ConvertArgs& args) {
  if (!args.lora.empty() && is_gguf_path(args.out_dir))
    return usage_error(invalid_argument("--lora writes a checkpoint directory; convert the merged directory to "
                                        "--out FILE.gguf in a second step"));
  if (args.lora.empty() && args.weights.empty())
    return usage_error(invalid_argument("--weights is required (q8 | q4; a GGUF type with --out FILE.gguf; "
                                        "left off only with --lora, to keep the dtype)"));
  if (is_gguf_path(args.out_dir)) return run_convert_gguf(args);
  if (!args.weights.empty() && args.weights != "q8" && args.weights != "q4")
    return usage_error(invalid_argument("--weights " + args.weights + ": a checkpoint directory output takes q8 or q4 "
                                        "(" + gguf_type_list() + " need --out FILE.gguf)"));
  const bool q4 = args.weights == "q4";
  if (q4 && (args.group_size < 32 || args.group_size > 4096 || args.group_size % 32 != 0))
    return usage_error(invalid_argument("--group-size " + std::to_string(args.group_size) +
                                        ": must be a positive multiple of 32 up to 4096 (default 128)"));
  ConvertOptions opt;
  opt.model_dir = args.model_dir;
  opt.out_dir = args.out_dir;
  opt.quantize.format = args.weights.empty() ? WeightQuant::kNone : args.weights == "q8" ? WeightQuant::kQ8 : WeightQuant::kQ4;
  opt.quantize.group_size = args.group_size;
  opt.quantize.embeddings = !args.keep_embeddings;
  opt.force = args.force;
  opt.shard_bytes = static_cast<size_t>(args.shard_mb) << 20;
  size_t in_bytes = 0, out_bytes = 0;
  int64_t n_quantized = 0, n_matrices_kept = 0;
  double seconds = 0;
  opt.on_tensor = [&](const ConvertProgress& p) {
    in_bytes += p.in_bytes;
    out_bytes += p.out_bytes;
    n_quantized += p.action != "copy";
    // A 2-D weight left as stored: under q4, its columns are not a multiple of the group size.
    const bool matrix = p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0 &&
                        p.name.find("norm") == std::string::npos;
    const bool kept = p.action == "copy" && matrix && (!args.keep_embeddings || p.name != "model.embed_tokens.weight");
    n_matrices_kept += kept;
    seconds = p.seconds;
    if (args.quiet) return;
    char rate[32] = "";
    if (p.seconds >= 0.05) std::snprintf(rate, sizeof(rate), "  %7.1f MB/s", in_bytes / 1e6 / p.seconds);
    std::fprintf(stderr, "[%4lld/%lld] %-48s %-4s %9.1f MB -> %9.1f MB%s%s\n", (long long)p.index, (long long)p.count,
                 p.name.c_str(), p.action.c_str(), p.in_bytes / 1e6, p.out_bytes / 1e6, rate,
                 kept && q4 ? "  (kept: columns not a multiple of --group-size)" : "");
  };
  ThreadPool pool(args.threads);
  std::unique_ptr<Model> merged;  // --lora: holds the replacements' memory
  if (!args.lora.empty())
    if (const Status s = merge_for_convert(args, opt, &merged, &pool); !s.ok()) return report(s);
  const Status status = convert_checkpoint(opt, &pool);
  if (!status.ok()) return report(status);
  if (!args.quiet)
    std::fprintf(stderr, "wrote %s: %lld tensors quantized to %s, %.3f GB -> %.3f GB in %s\n", args.out_dir.c_str(),
                 (long long)n_quantized, args.weights.empty() ? "none (dtypes kept)" : args.weights.c_str(), in_bytes / 1e9, out_bytes / 1e9,
                 duration_text(seconds).c_str());
  if (n_matrices_kept > 0)  // also with --quiet: the output is not what was asked for
    std::fprintf(stderr,
                 "warning: %lld matrices were left unquantized (%lld quantized)%s\n", (long long)n_matrices_kept,
                 (long long)n_quantized,
                 q4 ? "; their columns are not a multiple of --group-size: a smaller --group-size (32, 64) quantizes them"
                    : "");
  return 0;
}

// Every --weights value: q8, q4 and the GGUF types.
std::vector<std::string> weights_names() {
  std::vector<std::string> names = {"q8", "q4"};
  for (const auto& [name, type] : kGgufTypes) names.push_back(name);
  return names;
}

}  // namespace

RunFn add_convert_command(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Write a copy of a checkpoint with q8 or q4 quantized weights, or a GGUF file");
  cmd->add_option("--model", args->model_dir, "Hugging Face checkpoint directory to convert")->required();
  cmd->add_option("--out", args->out_dir, "Directory to write, or FILE.gguf (must not exist unless --force)")->required();
  cmd->add_option("--weights", args->weights,
                  "q8: int8, one f32 scale per row; q4: 4-bit, f16 scale and min per group of columns; "
                  "for --out FILE.gguf: " + gguf_type_list() + " (llama.cpp's types)")
      ->check(CLI::IsMember(weights_names()));
  cmd->add_option("--group-size", args->group_size, "q4: columns per scale and min (a multiple of 32; 32, 64 and multiples of 128 run the int8 kernel)")
      ->capture_default_str();
  cmd->add_option("--lora", args->lora,
                  "A PEFT LoRA adapter directory to merge into the weights (docs/lora.md); without --weights the "
                  "merged checkpoint keeps the model's dtypes");
  cmd->add_flag("--force", args->force, "Replace an existing output directory");
  cmd->add_flag("--keep-embeddings", args->keep_embeddings, "Leave model.embed_tokens.weight unquantized");
  cmd->add_option("--threads", args->threads, "Threads (0: all hardware threads)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--shard-size-mb", args->shard_mb, "Largest safetensors shard to write, in MB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--quiet", args->quiet, "No progress on stderr");
  return [args] { return run_convert(*args); };
}

}  // namespace dc::cli
