// `diffucoder convert --model DIR --out DIR2 --weights q8|q4 [--group-size 128] [--force]`: writes a
// quantized copy of a checkpoint (formats in README.md "Quantized weights"); progress on stderr.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/convert.h"

namespace dc::cli {
namespace {

struct ConvertArgs {
  std::string model_dir, out_dir, weights;
  int64_t group_size = 128;
  bool force = false, keep_embeddings = false, quiet = false;
  int threads = 0;
  int64_t shard_mb = 2048;
};

int run_convert(const ConvertArgs& args) {
  ConvertOptions opt;
  opt.model_dir = args.model_dir;
  opt.out_dir = args.out_dir;
  opt.quantize.format = args.weights == "q8" ? WeightQuant::kQ8 : WeightQuant::kQ4;
  opt.quantize.group_size = args.group_size;
  opt.quantize.embeddings = !args.keep_embeddings;
  opt.force = args.force;
  opt.shard_bytes = static_cast<size_t>(args.shard_mb) << 20;
  size_t in_bytes = 0, out_bytes = 0;
  int64_t n_quantized = 0;
  double seconds = 0;
  opt.on_tensor = [&](const ConvertProgress& p) {
    in_bytes += p.in_bytes;
    out_bytes += p.out_bytes;
    n_quantized += p.action != "copy";
    seconds = p.seconds;
    if (!args.quiet)
      std::fprintf(stderr, "[%4lld/%lld] %-48s %-4s %9.1f MB -> %9.1f MB  %7.1f MB/s\n", (long long)p.index,
                   (long long)p.count, p.name.c_str(), p.action.c_str(), p.in_bytes / 1e6, p.out_bytes / 1e6,
                   p.seconds > 0 ? in_bytes / 1e6 / p.seconds : 0.0);
  };
  ThreadPool pool(args.threads);
  const Status status = convert_checkpoint(opt, &pool);
  if (!status.ok()) return report(status);
  if (!args.quiet)
    std::fprintf(stderr, "wrote %s: %lld tensors quantized to %s, %.3f GB -> %.3f GB in %.1f s\n", args.out_dir.c_str(),
                 (long long)n_quantized, args.weights.c_str(), in_bytes / 1e9, out_bytes / 1e9, seconds);
  return 0;
}

}  // namespace

RunFn add_convert_command(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Write a copy of a checkpoint with q8 or q4 quantized weights");
  cmd->add_option("--model", args->model_dir, "Hugging Face checkpoint directory to convert")->required();
  cmd->add_option("--out", args->out_dir, "Directory to write (must not exist unless --force)")->required();
  cmd->add_option("--weights", args->weights,
                  "q8: int8, one f32 scale per row; q4: 4-bit, f16 scale and min per group of columns")
      ->required()
      ->check(CLI::IsMember({"q8", "q4"}));
  cmd->add_option("--group-size", args->group_size, "q4: columns per scale and min (a multiple of 32; 32, 64 and multiples of 128 run the int8 kernel)")
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "Replace an existing output directory");
  cmd->add_flag("--keep-embeddings", args->keep_embeddings, "Leave model.embed_tokens.weight unquantized");
  cmd->add_option("--threads", args->threads, "Threads (0: all hardware threads)")->capture_default_str();
  cmd->add_option("--shard-size-mb", args->shard_mb, "Largest safetensors shard to write, in MB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--quiet", args->quiet, "No progress on stderr");
  return [args] { return run_convert(*args); };
}

}  // namespace dc::cli
