// The subcommands of the `diffucoder` binary. Each registers its options on a CLI11 subcommand and
// returns the function that runs it; main() calls the one the user chose and exits with its code.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "train/optimizer.h"

namespace CLI {
class App;
}
namespace dc {
class Profiler;
}

namespace dc::cli {

using RunFn = std::function<int()>;

RunFn add_generate_command(CLI::App& app);
RunFn add_tokenize_command(CLI::App& app);
RunFn add_inspect_command(CLI::App& app);
RunFn add_bench_command(CLI::App& app);
RunFn add_convert_command(CLI::App& app);
RunFn add_serve_command(CLI::App& app);
RunFn add_train_command(CLI::App& app);
RunFn add_eval_command(CLI::App& app);
RunFn add_grpo_loss_command(CLI::App& app);
RunFn add_grpo_command(CLI::App& app);
RunFn add_devices_command(CLI::App& app);

// The optimizer flags `train` and `grpo` share (train.cc): --lr, --lr-schedule, --min-lr-ratio, --beta1,
// --beta2, --adam-eps, --weight-decay, --max-grad-norm, into the values pointed at (their defaults).
struct OptimizerFlags {
  double* lr;
  std::string* schedule;
  double *min_lr_ratio, *beta1, *beta2, *adam_eps, *weight_decay, *max_grad_norm;
};
void add_optimizer_flags(CLI::App* cmd, const OptimizerFlags& to);
// --dist-timeout (train.cc), which `train` and `grpo` share: under mpirun, the seconds a rank waits in one
// collective before ending the job.
void add_dist_timeout_flag(CLI::App* cmd, double* seconds);
// The LoRA flags `train` and `grpo` share (train.cc): --lora-r, --lora-alpha, --lora-targets, --lora-dropout.
struct LoraFlags {
  int64_t* r;
  double* alpha;
  std::string* targets;
  double* dropout;
};
void add_lora_flags(CLI::App* cmd, const LoraFlags& to);

// `diffucoder bench --train` (bench_train.cc): times masked-diffusion optimizer steps. bench.cc fills
// the options it shares with the generation benchmark; add_bench_train_options registers the others
// (--train, --seq-len, --mask-ratio, --lr, --grad-checkpointing) on the bench subcommand.
struct BenchTrainArgs {
  bool enabled = false;
  std::string model_dir, shape;
  int64_t seq_len = 256, prompt_len = 64;
  int batch = 1, steps = 3, threads = 0;
  double mask_ratio = 0.5, lr = 1e-4;
  uint64_t seed = 0;
  bool json = false, grad_checkpointing = false, no_peak = false;
  bool profile = false;            // per-phase timers (core/profiler.h) of the timed steps
  std::string precision = "auto";  // bench's --precision: auto / bf16 = mixed precision, f32
  int64_t layers = 0, vocab = 0;   // --shape with only this many layers / this vocabulary (0: the shape's)
  // --lora-r R: train LoRA adapters (alpha = R) over the frozen base, which --shape builds with bench's
  // --weights (bf16 / q8 / q4) or --model loads as stored.
  int64_t lora_r = 0;
  std::string lora_targets = "all-linear";
  std::string weights = "bf16";
};
void add_bench_train_options(CLI::App* cmd, BenchTrainArgs* args);
// bench's --layers / --vocab: a --shape model with this many layers and this vocabulary (0: the shape's; the
// last two ids of a smaller vocabulary are the mask and the pad / end token), e.g. a 7B-shape layer stack that
// fits in memory, or a shape whose embedding fits a small device's largest buffer.
Status check_reshape(const std::string& shape, int64_t layers, int64_t vocab);
int run_bench_train(const BenchTrainArgs& args);
// The --profile table (bench_train.cc): every timed path of `profiler` (exclusive of its nested scopes) per step,
// longest first, with its share of step_total seconds over `steps` steps, and the rest of the steps.
void print_profile(const Profiler& profiler, int steps, double step_total);

}  // namespace dc::cli
