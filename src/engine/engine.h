// Engine: a loaded model, its tokenizer and a thread pool, with the glue between them: the model as
// the sampler's LogitsFn, prompt encoding (plain or chat), and the post-processing of completions.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "lora/trainable.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "sampler/generate.h"
#include "tokenizer/tokenizer.h"

namespace dc {

// How an adapter is applied (EngineOptions::lora_mode).
enum class LoraMode { kMerged, kUnmerged };

// An adapter under a name (EngineOptions::lora_adapters; `serve --lora NAME=DIR`).
struct NamedLora {
  std::string name;
  std::string dir;
};

struct EngineOptions {
  std::string model_dir;       // a Hugging Face checkpoint directory, or a dream FILE.gguf (gguf/dream.h)
  std::string tokenizer_path;  // "" = model_dir/tokenizer.json (a GGUF's own tokenizer) when it exists, else none
  int n_threads = 0;           // <= 0: all hardware threads
  // The largest KV cache (SamplingParams::cache prefix / dual) a generation may allocate:
  // 2 · n_layer · rows · positions · n_head_kv · head_dim · 4 bytes. Larger requests are refused.
  static constexpr int64_t kDefaultMaxKvCacheBytes = int64_t{8} << 30;
  int64_t max_kv_cache_bytes = kDefaultMaxKvCacheBytes;
  // What the matmuls feed to bf16 weights (core/context.h): kF32 is the reference's arithmetic (f32
  // activations, the exact path the parity tests use); kBF16 rounds activations to bf16 for ~2x faster
  // GEMMs (~3e-3 relative logit error), as the reference computes under torch_dtype=bfloat16. Unset:
  // follow the checkpoint (checkpoint_precision()).
  std::optional<MatmulPrecision> matmul_precision;
  // The packed-weight cache (Model::pack_weights, model/weight_cache.h): "" puts it at its default
  // place (beside the checkpoint, else the user's cache directory), "off" disables it, anything else is
  // the directory to keep it in.
  std::string weight_cache;
  // Where the forward runs (--device): the CPU, or a Vulkan device that gets a copy of the weights at
  // load (no packing, no packed-weight cache; f32 arithmetic, but for the GEMMs on a device's matrix
  // units at kBF16: DeviceBackend::set_matrix_units); every cache mode, its KV cache on the device.
  DeviceSpec device;
  // A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors, docs/lora.md) merged
  // into the weights at load, before packing or the upload to a device: W' = W + scale · B·A, stored as the
  // base stores W (q8 / q4 / GGUF blocks quantized again). "" = none. A merged model keeps no packed-weight
  // cache (the cache is keyed by the base checkpoint's files). Errors name the adapter file and field / tensor.
  std::string lora_dir;
  // How lora_dir is applied (--lora-mode): kMerged as above; kUnmerged keeps the base weights as they are
  // (packed as usual, the packed-weight cache usable) and holds the adapter in f32 beside them
  // (LoraParams::from_adapter), set as the model's default adapters (Model::set_lora): added by every forward whose
  // ForwardBatch::lora is null: 2·r·(in + out) flops per position per adapted projection. Refused for an
  // adapter with modules_to_save or an lm_head target. On a device the adapter is uploaded at load (f32, beside
  // the weights: Engine::load_note's weights count it) and the products run there.
  LoraMode lora_mode = LoraMode::kMerged;
  // Adapters held unmerged beside the base and applied to no forward unless its ForwardBatch::lora picks one
  // (Engine::lora_adapter(name)): `serve`'s per-request adapters. Names unique and non-empty; on a device each is
  // uploaded at load and kept there, as lora_dir's unmerged one.
  std::vector<NamedLora> lora_adapters;
};

// "merged" | "unmerged" (--lora-mode); errors name the flag and the value.
Result<LoraMode> parse_lora_mode(const std::string& text);

// The matmul precision a checkpoint computes in by default: kBF16 when its matrices are stored in bf16
// (or, all quantized, converted from a bfloat16 checkpoint), else kF32.
MatmulPrecision checkpoint_precision(const Model& model);

// Cache committed computes scattered positions, which the device kernels do not take: invalid_argument
// naming `cache` when params.cache is committed and `device` (the engine's, null: the CPU) is a device.
Status check_cache_on_device(const SamplingParams& params, const DeviceBackend* device);

// Engine::generate over any model: checks the prompts against the vocabulary and the context length
// (and, with a KV cache, its size against max_kv_cache_bytes), then runs the sampler with a fresh
// chunked HeadFn (as Engine::head_fn) over `model` computing with ctx's pool and precision (its own KV
// cache and scratch; ctx.workspace is not used). hooks.pool null: ctx.pool samples a logits_hook's rows.
// Errors name the prompt index. GRPO rollouts use it over the policy's weights in training.
Result<GenerateOutput> generate_on_model(const Model& model, const Context& ctx, int64_t max_kv_cache_bytes,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const SamplingParams& params, GenerateHooks hooks = {});

class Engine {
 public:
  // Loads and checks the checkpoint and, when present, the tokenizer. Errors name the file.
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  // An engine over a model already in memory (e.g. a synthetic benchmark model); no tokenizer.
  static std::unique_ptr<Engine> from_model(std::unique_ptr<Model> model, int n_threads) {
    auto engine = std::unique_ptr<Engine>(new Engine(std::move(model), nullptr, n_threads));
    engine->pack_or_note();  // packs what is worth packing
    return engine;
  }
  // The same with the forward on `device` and a KV cache of at most max_kv_cache_bytes per generation;
  // errors as use_device's.
  static Result<std::unique_ptr<Engine>> from_model(std::unique_ptr<Model> model, int n_threads, const DeviceSpec& device,
                                                    int64_t max_kv_cache_bytes = EngineOptions::kDefaultMaxKvCacheBytes);

  const Model& model() const { return *model_; }
  const ModelConfig& config() const { return model_->config(); }
  // nullptr when the checkpoint has no tokenizer.json and none was given.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  ThreadPool& pool() { return pool_; }
  // The matmul precision of every later forward (EngineOptions::matmul_precision). Also re-lays, once,
  // the matrices the fast GEMMs then read faster (Model::pack_weights: bf16 ones at kBF16 with
  // AVX512_BF16, q8 / q4 ones with VNNI). Fails only when memory runs out for that; the rest then
  // stays row-major (same results, slower). On a device: kBF16 lets the GEMMs use its matrix units, kF32
  // keeps them exact f32 (no re-layout).
  // Not while the engine generates: with a generate() call running on another thread, or a function from
  // logits_fn() / head_fn() alive (e.g. a server's scheduler holds one), it changes nothing and returns
  // kFailedPrecondition ("a generation is running ..."): re-packing would rewrite the weights a forward reads.
  // generate(), logits_fn() and head_fn() called while it re-packs wait until it is done (then use the new
  // precision). Thread-safe; a second call while one re-packs is refused the same way.
  Status set_matmul_precision(MatmulPrecision precision);
  MatmulPrecision matmul_precision() const;
  // The backend of the device the forward runs on (EngineOptions::device); null on the CPU.
  const DeviceBackend* backend() const { return backend_.get(); }
  // What loading did with the packed-weight cache (EngineOptions::weight_cache).
  const WeightCacheReport& weight_cache_report() const { return weight_cache_report_; }
  // One sentence for the user: the matmul precision and what happened to the packed-weight cache, e.g.
  // "matmul precision bf16; packed weights mapped from DIR/diffucoder-packed.bf16.bin".
  std::string load_note() const;
  // "" without an adapter, else what the merge of EngineOptions::lora_dir changed, e.g. "LoRA DIR merged
  // into 28 matrices".
  const std::string& lora_note() const { return lora_note_; }
  // The adapter EngineOptions::lora_adapters holds under `name`, as a forward reads it (ForwardBatch::lora);
  // null when there is none of that name. Valid while the Engine lives.
  const LoraWeights* lora_adapter(const std::string& name) const;
  // The names of EngineOptions::lora_adapters, in the options' order.
  std::vector<std::string> lora_adapter_names() const;

  // The reference's effective defaults (sampler/generate.h) with this model's mask / pad ids and
  // context length. generation_config.json is NOT applied, as in the reference (spec §3.2).
  SamplingParams default_params() const;

  // The model as the sampler sees it. Valid while the Engine lives. Each call makes a new function with
  // its own KV cache (empty until the first CacheOp::kRefresh forward sizes it; refused with out_of_range
  // when larger than max_kv_cache_bytes), used by every batch whose cache_op is not kNone and whose
  // cache is null, and its own scratch for the forward's activations (Context::workspace), both freed
  // with the function: use one function per generation, from one thread at a time.
  LogitsFn logits_fn();

  // The model as generate() uses it by default: the forward to the final-normed hidden rows, then the
  // lm_head and the sampling in chunks of Model::kHeadChunkRows rows (engine/head_sampler.h), never the
  // whole [n_out, n_vocab] logits; the same tokens as logits_fn(). Its own KV cache, scratch and chunk
  // block, as logits_fn()'s: one function per generation, from one thread at a time.
  HeadFn head_fn();
  // head_fn() over several parts in one forward (PartsHeadFn: a server's requests with a KV cache, each part
  // bringing its own cache; a refresh larger than max_kv_cache_bytes is refused with out_of_range naming the
  // part), its own scratch and chunk block; on a device the forward of parts runs there, recorded into the
  // submission of the sample() or sample_parts() that follows (DeviceHeadSampler: a server's merged step is one
  // submission).
  PartsHeadFn parts_head_fn();
  // What head_fn()'s steps hold: the hidden row per out row, and the chunk block once per function.
  HeadMemory head_memory() const;

  // Bytes of the KV cache a generation of `n_rows` canvases of `n_seq` positions needs with cache on.
  int64_t kv_cache_bytes(int64_t n_rows, int64_t n_seq) const;
  int64_t max_kv_cache_bytes() const { return max_kv_cache_bytes_; }  // EngineOptions::max_kv_cache_bytes

  // Encodes a prompt; with `chat`, wraps it in the Instruct format first (tokenizer/chat.h).
  // Errors when there is no tokenizer or the text is not valid UTF-8.
  Result<std::vector<int32_t>> encode_prompt(const std::string& text, bool chat) const;

  // generate_on_model over this engine's model, context and max_kv_cache_bytes (so a fresh KV cache per
  // call). Errors name the prompt index. Thread-safe: several
  // threads may generate on one engine at once (the pool serialises their parallel sections; each gets
  // the tokens it would get alone).
  Result<GenerateOutput> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                  GenerateHooks hooks = {});
  // Times the ops of later generate() calls into *profiler (core/profiler.h; null: off, the default): bench's
  // breakdown of a step. A Profiler is not thread-safe: while one is set, generate from one thread at a time.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }

  // Where completions are cut (spec §3.7): with <|dlm_pad|> in the vocabulary (Instruct, cpGRPO) at
  // <|dlm_pad|> and <|im_end|>; otherwise (Base) at the eos token.
  std::vector<int32_t> stop_ids() const;

  // The post-processed text of one generated row: cut at stop_ids(), ids the tokenizer does not know
  // dropped (as Hugging Face's decode does), decoded without skipping special tokens (as the
  // reference's README does). Errors when there is no tokenizer.
  Result<std::string> completion_text(const std::vector<int32_t>& generated) const;

 private:
  Engine(std::unique_ptr<Model> model, std::unique_ptr<Tokenizer> tokenizer, int n_threads)
      : model_(std::move(model)), tokenizer_(std::move(tokenizer)), pool_(n_threads) {
    ctx_.pool = &pool_;
  }

  // Packs at ctx_'s precision (through the cache at `cache_path` when not ""); when memory runs out a
  // line on stderr says the rest stays row-major.
  void pack_or_note(const std::string& cache_path = "");
  // A generation's hold on the weights and ctx_ (generate() for its duration, a logits_fn() / head_fn()
  // function for its lifetime): waits while set_matmul_precision re-packs, then counts as running until the
  // returned token is destroyed (on any thread).
  std::shared_ptr<void> begin_generation();
  // Opens `device` and uploads the model's weights to it (row-major: before any packing), then the unmerged
  // adapters (unmerged_lora_, adapters_: Model::lora_to_device, once); the CPU: nothing. Errors: no such device
  // or driver, too little device memory for the weights (Model::to_device) or for the adapters beside them.
  Status use_device(const DeviceSpec& device);

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ThreadPool pool_;
  std::unique_ptr<DeviceBackend> backend_;  // the device of ctx_ (Device::kVulkan), null on the CPU
  Context ctx_;
  Profiler* profiler_ = nullptr;  // set_profiler's, for generate()
  int64_t max_kv_cache_bytes_ = EngineOptions::kDefaultMaxKvCacheBytes;
  WeightCacheReport weight_cache_report_;
  std::string lora_note_;
  // --lora-mode unmerged: the adapter every forward adds when its batch names none (the model's set_lora;
  // null: none).
  std::unique_ptr<LoraParams> unmerged_lora_;
  // EngineOptions::lora_adapters, loaded (stable addresses: forwards point at their weights()).
  std::vector<std::pair<std::string, std::unique_ptr<LoraParams>>> adapters_;
  // The generations against set_matmul_precision (a reader / writer gate whose tokens may be released on
  // another thread than took them, which std::shared_mutex does not allow).
  mutable std::mutex gate_mutex_;
  std::condition_variable gate_cv_;
  int64_t generations_ = 0;  // tokens of begin_generation alive
  bool repacking_ = false;   // set_matmul_precision is changing ctx_ and the weights
};

}  // namespace dc
