// The decoding flags shared by `generate` and `eval`.
#include "cli/decoding_flags.h"

#include "cli/common.h"

namespace dc::cli {

void add_decoding_flags(CLI::App* cmd, DecodingFlags* f) {
  cmd->add_option("--alg", f->alg, "origin | maskgit_plus | topk_margin | entropy")->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", f->top_p, "Nucleus filter, 1 = off")->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "Top-k filter, 0 = off")->capture_default_str();
  cmd->add_option("--alg-temp", f->alg_temp, "> 0: sample positions from softmax(confidence/alg_temp)")
      ->capture_default_str();
  cmd->add_option("--eps", f->eps, "Final diffusion time")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Random seed")->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (0 = all)")->capture_default_str()
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--block-length", f->block_length, "Decode in blocks of N tokens left to right (0 = off)")
      ->capture_default_str();
  cmd->add_option("--cache", f->cache, "KV cache with blocks: none | prefix | dual | committed")->capture_default_str();
  cmd->add_option("--refresh-every", f->refresh_every,
                  "--cache committed: recompute the whole block every K-th forward of a block (1 = dual)")
      ->capture_default_str()->check(CLI::Range(1, static_cast<int>(kMaxSteps)));
  cmd->add_option("--threshold", f->threshold, "Commit every block position with confidence >= X (0 = off)");
  cmd->add_option("--factor", f->factor, "Commit the largest n with (n+1)(1-c_n) < X (0 = off)");
  cmd->add_flag("--fast", f->fast,
                "Fast-dLLM mode: --block-length 32 --cache dual --threshold 0.9 unless set (approximate)");
  cmd->add_option("--precision", f->precision,
                  "Matmul activations: auto (bf16 for bf16 checkpoints) | f32 (the reference's exact path) | bf16")
      ->capture_default_str();
  cmd->add_option("--weight-cache", f->weight_cache,
                  "Where to keep the packed weights between starts: a directory, or off (default: beside the model)");
  cmd->add_option("--device", f->device,
                  "Where the forward runs: cpu | vulkan | vulkan:N (`diffucoder devices`)")
      ->capture_default_str();
  cmd->add_option("--lora", f->lora, "A PEFT LoRA adapter directory applied to the model (docs/lora.md)");
  cmd->add_option("--lora-mode", f->lora_mode,
                  "merged (into the weights at load) | unmerged (the base as it is, the adapter added by every "
                  "forward; CPU only)")->capture_default_str();
}

diffucoder::GenerationConfig apply_decoding_flags(diffucoder::GenerationConfig c, const DecodingFlags& f) {
  c.alg = f.alg;
  c.cache = f.cache;
  c.refresh_every = f.refresh_every;
  c.temperature = f.temperature;
  c.top_p = f.top_p;
  c.top_k = f.top_k;
  c.alg_temp = f.alg_temp;
  c.eps = f.eps;
  c.seed = f.seed;
  c.block_length = f.block_length;
  c.threshold = f.threshold;
  c.factor = f.factor;
  c.fast = f.fast;
  return c;
}

Result<EngineOptions> engine_options(const DecodingFlags& f, const std::string& model_dir,
                                     const std::string& tokenizer_path) {
  DC_ASSIGN_OR_RETURN(std::optional<MatmulPrecision> precision, parse_matmul_precision(f.precision));
  EngineOptions options;
  options.model_dir = model_dir;
  options.tokenizer_path = tokenizer_path;
  options.n_threads = f.threads;
  options.matmul_precision = precision;
  options.weight_cache = f.weight_cache;
  options.lora_dir = f.lora;
  DC_ASSIGN_OR_RETURN(options.lora_mode, parse_lora_mode(f.lora_mode));
  DC_ASSIGN_OR_RETURN(options.device, parse_device(f.device));
  return options;
}

diffucoder::LoadOptions load_options(const DecodingFlags& f, const std::string& model_dir,
                                     const std::string& tokenizer_path) {
  diffucoder::LoadOptions o{model_dir, tokenizer_path, f.threads, f.precision, f.weight_cache};
  o.device = f.device;
  o.lora_dir = f.lora;
  o.lora_mode = f.lora_mode;
  return o;
}

}  // namespace dc::cli
