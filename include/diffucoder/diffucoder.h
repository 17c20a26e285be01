// The public C++ API of diffucoder.cpp: load a DiffuCoder / Dream checkpoint, tokenize and decode, format
// chat prompts, run the model's forward, diffusion-generate with per-step, logits and tokens hooks and
// cancellation, continuous batching of requests from many threads (BatchEngine: batch.h, included at the
// end), fine-tune (Trainer: one SFT optimizer step at a time) and reinforce (GrpoTrainer: Coupled-GRPO), data
// parallel over Ranks. These two headers are the whole public surface (standard library only: they include
// nothing of src/, which may change); the installed library is `diffucoder::diffucoder` (CMake) / `diffucoder`
// (pkg-config). The CLI's `generate`, `train`, `grpo` and `bench` and the Python package (python/) are built on
// it; `serve` decodes with its BatchEngine.
//
//   auto model = diffucoder::Model::load({.model_dir = "DiffuCoder-7B-Instruct"});   // diffucoder::Result<...>
//   if (!model.ok()) { std::cerr << model.status().message() << "\n"; return 1; }
//   auto ids = (*model)->tokenizer()->encode(diffucoder::Model::instruct_prompt("Write quicksort in Python."));
//   diffucoder::GenerationConfig c = (*model)->default_config();
//   c.max_new_tokens = 256; c.steps = 256; c.alg = "entropy"; c.temperature = 0;
//   auto out = (*model)->generate({*ids}, c, {.on_step = [](const diffucoder::StepEvent& s) { return true; }});
//   std::cout << *(*model)->completion_text(out->generated(0));
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace diffucoder {

// What went wrong; every error message names the file, tensor, field or option and hints at the fix.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // a parameter or field has a bad value
  kNotFound,           // a file, tensor or key is missing
  kIoError,            // reading or writing failed
  kParseError,         // a file is malformed
  kOutOfRange,         // a length or index exceeds a limit
  kUnimplemented,      // valid input that the engine does not support yet
  kResourceExhausted,  // memory ran out (KV cache, forward workspace, kernel scratch)
  kCancelled,          // the caller stopped the work (a hook returned false, Hooks::cancel)
  kFailedPrecondition,  // valid, but not in the object's present state (e.g. while a generation runs)
  kInternal,
};

// "ok", "invalid argument", "not found", ...
inline const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kParseError: return "parse error";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kUnimplemented: return "unimplemented";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kFailedPrecondition: return "failed precondition";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

// ok, or a code and a message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "ok".
  std::string to_string() const { return ok() ? "ok" : std::string(status_code_name(code_)) + ": " + message_; }
  // The message prefixed with context ("text 3: ..."); ok stays ok.
  Status with_context(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or a failed Status (a Result built from an ok Status holds kInternal).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}   // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  // Precondition: ok(). Prints the status and aborts otherwise (a programming error, not an input error).
  T& value() & { check_ok(); return std::get<T>(v_); }
  const T& value() const& { check_ok(); return std::get<T>(v_); }
  T&& value() && { check_ok(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check_ok() const {
    if (ok()) return;
    std::fprintf(stderr, "fatal: value() on a failed diffucoder::Result: %s\n", status().to_string().c_str());
    std::abort();
  }
  std::variant<T, Status> v_;
};

// The library's messages (the "note:" lines: weights left unpacked, a packed-weight cache not written,
// training in f32 on a CPU without AVX512_BF16). Without a callback they go to stderr as
// "note: <message>" (warnings), "error: <message>" (errors) or the message alone (info).
enum class LogLevel { kDebug = 0, kInfo, kWarning, kError };
using LogCallback = std::function<void(LogLevel, std::string_view)>;
// Sets the process-wide callback (an empty one: back to stderr). It is called on the thread that logs, from
// several at once possibly, and may be called from the library's background threads: it must be
// thread-safe. Thread-safe itself; the previous callback is destroyed after its last call returns.
void set_log_callback(LogCallback callback);

// A model name as the CLI's --model and Python's from_pretrained take it: an existing path is returned as
// is; "ORG/NAME[@REVISION]" is its snapshot directory in Hugging Face's local cache ($HF_HUB_CACHE,
// $HF_HOME/hub, ~/.cache/huggingface/hub; no network): kNotFound naming the paths looked at and the
// command that downloads it; anything else is returned unchanged, for Model::load to report.
Result<std::string> resolve_model_path(std::string_view name_or_path);

// A model of a named shape with random weights, built in memory (no files, no tokenizer): a benchmarking aid
// (`diffucoder bench --shape`, `bench --train --shape`), for LoadOptions::synthetic and TrainConfig::synthetic.
struct SyntheticModel {
  std::string shape;             // "diffucoder-7b" (DiffuCoder-7B's config), "qwen2.5-0.5b" (Dream at Qwen2.5-0.5B's
                                 // size) or "tiny" (2 layers, hidden 64, vocabulary 4096)
  int64_t layers = 0;            // 0: the shape's; else this many layers, in [1, 1024]
  int64_t vocab = 0;             // 0: the shape's; else this vocabulary, in [16, 1048576] (its last two ids the
                                 // mask and the pad / end token)
  std::string weights = "bf16";  // matrices uniform with std 0.02 (norm weights 1): "bf16", or "q8" / "q4"
                                 // quantized matrix by matrix as they are drawn
  int64_t group_size = 128;      // "q4": columns per scale (a multiple of 32, at most 4096)
  uint64_t seed = 0;             // the weights are a function of the seed alone
};

struct LoadOptions {
  std::string model_dir;            // a Hugging Face checkpoint directory (config.json, *.safetensors)
  std::string tokenizer_path;       // "" = model_dir/tokenizer.json when it exists (else no tokenizer)
  int threads = 0;                  // <= 0: all hardware threads
  std::string precision = "auto";   // matmul activations: "auto" (the checkpoint's: bf16 for bf16 weights),
                                    // "f32" (the exact path of the parity tests) or "bf16"
  std::string weight_cache;         // packed-weight cache: "" beside the model, "off", or a directory
  int64_t max_kv_cache_bytes = int64_t{8} << 30;  // the largest KV cache one generation may allocate
  std::string device = "cpu";       // where the forward runs: "cpu", "vulkan" (device 0) or "vulkan:N"
                                    // (the Vulkan backend: every cache mode, the sampling on the device)
  std::string lora_dir{};           // a PEFT LoRA adapter directory merged into the weights at load
                                    // (docs/lora.md); "" = none
  std::string lora_mode = "merged"; // how lora_dir is applied: "merged" (into the weights at load: the base's
                                    // speed, no packed-weight cache) or "unmerged" (the base kept as it is,
                                    // cache usable, the adapter added in f32 by every forward: 2·r·(in + out)
                                    // flops per position per adapted projection; no modules_to_save / lm_head
                                    // target; on a device uploaded once at load)
  // Named adapters held unmerged beside the base (docs/lora.md): BatchRequest::adapter picks one per request,
  // the base alone otherwise (`serve --lora NAME=DIR`). Each is a PEFT LoRA directory; names unique and
  // non-empty, lora_dir "" with them; on a device each uploaded once at load (Model::adapter_names() lists them).
  struct NamedAdapter {
    std::string name, dir;
  };
  std::vector<NamedAdapter> lora_adapters{};
  // Instead of model_dir (then empty): a synthetic model of this shape (benchmarking aid; no tokenizer,
  // weight_cache and lora_dir do not apply). "auto" precision is bf16 for bf16 weights.
  std::optional<SyntheticModel> synthetic{};
};

// What a loaded checkpoint is (config.json), and its special token ids (-1 when absent).
struct ModelInfo {
  int64_t n_vocab = 0, hidden_size = 0, n_layer = 0, n_head = 0, n_head_kv = 0, max_position_embeddings = 0;
  int64_t head_dim = 0, intermediate_size = 0;  // per attention head; the MLP's width
  int32_t mask_token_id = -1, pad_token_id = -1, eos_token_id = -1, bos_token_id = -1;
  std::string torch_dtype;     // config.json's, e.g. "bfloat16"
  std::string precision;       // the matmul precision in use: "f32" or "bf16"
  std::string load_note;       // one sentence: the precision and what happened to the packed-weight cache
  int threads = 0;             // the CPU threads the model computes with
  std::string device = "cpu";  // where the forward runs: "cpu", or the device's name ("vulkan:0 (...)")
  int64_t device_memory_bytes = 0;  // on a device: its device-local heap (0 on the CPU)
  int64_t device_weight_bytes = 0;  // on a device: what its copy of the weights takes of that heap
};

// The sampler's settings; the defaults are the reference's effective ones (spec §3.2: temperature 1,
// top_k 50, alg "origin", 512 steps). Every field is checked by generate(), whose errors name it.
struct GenerationConfig {
  // Canvas length relative to the padded prompt width P: max_new_tokens set → P + max_new_tokens; else
  // max_length set → max_length (the total); else P + 20 capped by the context. Must exceed P.
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> max_length;
  int steps = 512;                  // diffusion steps, >= 1
  float eps = 1e-3f;                // in (0, 1): the last time of linspace(1, eps, steps + 1)
  std::string alg = "origin";       // "origin" | "maskgit_plus" | "topk_margin" | "entropy"
  float alg_temp = 0.0f;            // > 0: positions drawn from softmax(confidence / alg_temp)
  float temperature = 1.0f;         // >= 0; 0 = greedy
  float top_p = 1.0f;               // in (0, 1]; 1 = off
  int64_t top_k = 50;               // <= 0 = off
  int num_return_sequences = 1;     // completions per prompt, rows repeated consecutively
  uint64_t seed = 0;                // every random draw is a function of (seed, step, row, position)
  bool output_history = false;      // keep the canvas after every step (Generation::history)
  std::optional<int32_t> mask_token_id, pad_token_id;  // unset: config.json's
  // Fast-dLLM block decoding, approximate KV cache and parallel decoding (README); all off by default.
  int64_t block_length = 0;
  std::string cache = "none";       // "none" | "prefix" | "dual" | "committed" (dual that recomputes only the
                                    // block's masked and newly committed rows between refreshes; CPU only)
  int refresh_every = 4;            // cache "committed": every refresh_every-th forward of a block recomputes
                                    // the whole block (>= 1; 1 = "dual" token for token); unused otherwise
  float threshold = 0.0f, factor = 0.0f;
  bool fast = false;                // Fast-dLLM's defaults (blocks of 32, dual cache, threshold 0.9) for
                                    // whichever of the three are left off
};

// Checks every field that needs no model (ranges, names, combinations; with max_new_tokens set, block
// decoding's one step per block at least); invalid_argument naming the field. generate() checks the rest
// (token ids against the vocabulary, the canvas against the context).
Status check_config(const GenerationConfig& config);

// The config generate() runs: with `fast`, its defaults filled in for whichever of block_length, cache and
// threshold / factor are left off (fast is then false); else `config` as given. invalid_argument naming
// the field for an unknown alg or cache name.
Result<GenerationConfig> resolve_fast(const GenerationConfig& config);

// The model's forward of one step, for throughput reports: its time and its size.
struct ForwardEvent {
  double seconds = 0;          // its wall time (on a device, where it runs in its step's one submission with the
                               // lm_head and the sampling: from its start to the end of the step)
  double ended_at = 0;         // its end, in seconds from the start of generate()
  int64_t positions = 0;       // positions computed over all rows (with a KV cache: the window's)
  int64_t keys = 0;            // the keys each of them attends to (the canvas length)
};

// on_step's view, after the step's commits and on_tokens.
struct StepEvent {
  int step = 0, n_steps = 0;               // 0-based step; n_steps an upper bound with threshold / factor
  int64_t n_rows = 0, n_seq = 0;
  std::span<const int32_t> canvas;         // [n_rows, n_seq], left pads and prompts included
  int64_t n_committed = 0;                 // positions unmasked by this step, over all rows
  std::span<const int64_t> prompt_lengths; // [n_rows] real prompt tokens
  std::span<const int64_t> pad_counts;     // [n_rows] left pads
  int block = 0, n_blocks = 1;
  std::optional<ForwardEvent> forward;     // the step's forward (none when it committed without one)
};

// on_logits's view: the SHIFTED logits (row for position j = the model's output at j − 1, spec §2.6)
// of the masked positions this step samples, editable in place before sampling. The engine computes
// logits only for those positions, so there is one row per entry of `indices`, not one per position.
struct LogitsEvent {
  int step = 0, n_steps = 0;
  int64_t n_rows = 0, n_seq = 0, n_vocab = 0;
  std::span<const int32_t> canvas;   // [n_rows, n_seq] before this step's commits
  std::span<const int64_t> indices;  // [n] flat canvas index row · n_seq + position of each logits row
  std::span<float> logits;           // [n, n_vocab]
};

// on_tokens's view: the whole canvas, editable (ids in [0, n_vocab); the mask id masks a position).
struct TokensEvent {
  int step = 0, n_steps = 0;         // step −1: the call before the first step
  int64_t n_rows = 0, n_seq = 0;
  std::span<int32_t> canvas;         // [n_rows, n_seq]
};

struct Hooks {
  std::function<bool(const StepEvent&)> on_step;        // after every step; false cancels
  std::function<void(const LogitsEvent&)> on_logits;    // after each forward, before sampling
  std::function<void(const TokensEvent&)> on_tokens;    // before the first step and after every step
  const std::atomic<bool>* cancel = nullptr;            // checked after every step; true cancels
};

struct Generation {
  int64_t n_rows = 0, n_seq = 0, prompt_width = 0;  // generated tokens start at prompt_width in every row
  std::vector<int32_t> sequences;                   // [n_rows, n_seq]: left pads, prompt, generated
  std::vector<int64_t> prompt_lengths, pad_counts;  // [n_rows]
  std::vector<std::vector<int32_t>> history;        // [steps run][n_rows · n_seq] with output_history
  int steps_run = 0, forwards = 0;
  double total_ms = 0.0, forward_ms = 0.0, sampling_ms = 0.0;
  // Row r's generated tokens, not post-processed: sequences[r, prompt_width:].
  std::vector<int32_t> generated(int64_t row) const;
};

// One forward's input: [n_batch, n_seq] tokens; `valid` (1 real, 0 padding; empty = all real) and
// `positions` (empty = 0..n_seq−1 per row) are [n_batch, n_seq] too.
struct ForwardInput {
  int64_t n_batch = 0, n_seq = 0;
  std::span<const int32_t> tokens;
  std::span<const uint8_t> valid;
  std::span<const int32_t> positions;
};

// A Hugging Face tokenizer.json (byte-level BPE, the Qwen2 pre-tokenizer, added tokens). Thread-safe.
class Tokenizer {
 public:
  // Loads and checks the file; errors name it and the JSON field.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // HF's encode(text, add_special_tokens=False): added tokens split out, no BOS/EOS; invalid_argument
  // naming the byte offset for invalid UTF-8.
  Result<std::vector<int32_t>> encode(std::string_view text) const;
  // The text of `ids`; ids the tokenizer does not know (the embedding has more rows than there are
  // tokens) are dropped, as HF does. With skip_special_tokens, added tokens marked special are left out.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;  // as written in tokenizer.json
  std::optional<std::string> id_to_token(int32_t id) const;
  int32_t size() const;  // max id + 1 over the vocab and the added tokens

 private:
  friend class Model;
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Model {
 public:
  // Loads and checks the checkpoint and, when present, its tokenizer. Errors name the file or the option.
  static Result<std::unique_ptr<Model>> load(const LoadOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;
  // The checkpoint's tokenizer (LoadOptions::tokenizer_path or model_dir/tokenizer.json); nullptr when
  // there is none. Lives as long as the Model.
  const Tokenizer* tokenizer() const;

  // A prompt's ids (Tokenizer::encode), wrapped first in instruct_prompt() with `chat`; out_of_range when
  // the text cannot fit the context, not_found without a tokenizer.
  Result<std::vector<int32_t>> encode_prompt(std::string_view text, bool chat) const;

  // Chat text: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, the default system message first
  // when none is given, then "<|im_start|>assistant\n" when add_generation_prompt. invalid_argument
  // naming the message index for a role other than system / user / assistant.
  struct Message {
    std::string role, content;
  };
  static Result<std::string> apply_chat_template(const std::vector<Message>& messages, bool add_generation_prompt);
  // DiffuCoder's README single-turn format (a newline before the user's <|im_end|>).
  static std::string instruct_prompt(std::string_view query);

  // The reference's effective defaults with this model's special ids and context (generation_config.json
  // is not applied, as in the reference).
  GenerationConfig default_config() const;

  // Diffusion-generates from the prompts (unpadded token ids; shorter ones are left-padded with the pad
  // id). Errors: invalid_argument / out_of_range naming the config field or the prompt index; a hook
  // that cancels, or `cancel`, gives StatusCode::kCancelled; memory exhaustion kResourceExhausted.
  // Thread-safe: several threads may generate on one Model at once, each getting the tokens it would
  // get alone; hooks run on the calling thread.
  Result<Generation> generate(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& config,
                              const Hooks& hooks = {}) const;

  // The UNSHIFTED logits [n_batch, n_seq, n_vocab] of every position (query i attends key j iff both are
  // valid; rows with no valid key get a zero attention output). invalid_argument naming the field for
  // inconsistent sizes or ids out of the vocabulary. Thread-safe.
  Result<std::vector<float>> forward(const ForwardInput& input) const;

  // generate()'s checks of sizes against this model, for a caller that reports them in its own words before
  // generating (a server naming its request's fields). canvas_length: the canvas of a prompt of
  // `prompt_width` tokens under `config` (GenerationConfig's rules), out_of_range past the context.
  // check_generation_size: the prompts' rows × canvas against the engine's limits (rows per generation,
  // canvas positions, one step's logits), out_of_range naming the limit. check_token_ids: every id in
  // [0, n_vocab), else invalid_argument "<name>: token id X at index j is outside the vocabulary [0, n)".
  // kv_cache_bytes: the KV cache a generation of `rows` canvases of `canvas_length` allocates with a cache
  // mode, to compare with max_kv_cache_bytes() (LoadOptions::max_kv_cache_bytes; beyond it: invalid_argument).
  Result<int64_t> canvas_length(int64_t prompt_width, const GenerationConfig& config) const;
  Status check_generation_size(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& config) const;
  Status check_token_ids(std::span<const int32_t> ids, const std::string& name) const;
  int64_t kv_cache_bytes(int64_t rows, int64_t canvas_length) const;
  int64_t max_kv_cache_bytes() const;
  // The fixed block of logits one batched forward's head holds for this vocabulary (BatchEngine::
  // head_block_bytes(); BatchOptions::max_memory_bytes must be at least this).
  int64_t head_block_bytes() const;

  // Where completions end (spec §3.7): <|dlm_pad|> and <|im_end|> when the vocabulary has <|dlm_pad|>,
  // else the eos id. completion_text decodes the generated ids up to the first of them.
  std::vector<int32_t> stop_ids() const;
  Result<std::string> completion_text(std::span<const int32_t> generated) const;

  // The names of the LoRA adapters loaded unmerged beside the base (BatchRequest::adapter picks one); empty
  // for a model loaded without named adapters.
  std::vector<std::string> adapter_names() const;

  struct Impl;  // opaque: defined inside the library

 private:
  friend class BatchEngine;  // runs its batches on the model's engine
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The processes of a data-parallel run (`mpirun -np N program`, MPI built in), for TrainConfig::ranks:
// an opaque handle over the library's communicator. MPI starts in join and ends when the Ranks is
// destroyed, so a process joins once (and must not use MPI itself).
class Ranks {
 public:
  // MPI's world when an MPI launcher started this process as one of several ranks (the environment says
  // so: OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1, or PMIX_RANK with SLURM_NTASKS above 1), else this
  // process alone (size 1, no MPI). A collective that waits longer than timeout_s seconds (0: no limit)
  // ends the whole job with a message naming the operation; a SIGTERM from the launcher prints which rank
  // stopped. Launched as ranks without MPI built in: kUnimplemented saying so.
  static Result<std::unique_ptr<Ranks>> join(double timeout_s = 600);
  ~Ranks();
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  int rank() const;                    // 0 … size() − 1
  int size() const;
  std::string backend() const;         // "single" (one process) or "mpi"

  // Every rank calls it with its own settings ({name, value}, compared byte for byte) before its other
  // collectives: OK on every rank when all equal rank 0's (at once for one rank); else kInvalidArgument on
  // EVERY rank: on a rank that differs "rank R: --lr is 0.0002 here but 0.0001 on rank 0: every rank must
  // run with the same options and data", on the others which ranks differ in which setting. Another code:
  // the communication failed. Call barrier() after printing the message, before ending the job.
  Status check_same_settings(const std::vector<std::pair<std::string, std::string>>& settings);
  Status barrier();
  // Ends the whole job (every rank) with exit code `code` after printing `message`.
  [[noreturn]] void abort(int code, const std::string& message);

 private:
  friend class Trainer;
  friend class GrpoTrainer;
  struct Impl;
  explicit Ranks(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Masked-diffusion fine-tuning (SFT) of a checkpoint, the `diffucoder train` command as a library: f32
// master weights, bf16 mixed precision by default, AdamW with a learning-rate schedule, checkpoints in the
// Hugging Face layout and bit-exact resume, data parallel over Ranks (docs/train.md has the data format and
// the math). Trainer::create refuses a bad value naming the field.
struct TrainConfig {
  std::string model_dir;            // the checkpoint to start from (its tokenizer.json encodes the data)
  std::string data_path;            // JSONL ({"prompt", "completion"} or {"messages"}) or plain text
  bool instruct_template = false;   // {"prompt"} lines in DiffuCoder's Instruct format (`train --instruct-template`)
  std::string out_dir;              // checkpoints, metrics.jsonl, loss.svg; "" = write nothing
  int64_t seq_len = 256, batch_size = 4, grad_accum = 1, steps = 100;
  double lr = 1e-5, min_lr_ratio = 0.0, weight_decay = 0.0, max_grad_norm = 1.0;  // max_grad_norm 0: no clipping
  int64_t warmup_steps = 0;
  std::string lr_schedule = "cosine";  // "constant" | "linear" | "cosine"
  double beta1 = 0.9, beta2 = 0.999, adam_eps = 1e-8;  // AdamW: betas in [0, 1), eps > 0
  double t_eps = 1e-3;                 // the mask ratio t ~ U(t_eps, 1); t_eps in [1e-9, 0.999]
  // "tokens": the loss ÷ the maskable tokens of the batch | "sequences": LLaDA's ÷ each answer's length,
  // the mean over the batch
  std::string loss_norm = "tokens";
  int32_t pad_token_id = -1;           // the canvas fill: this id, or below 0 <|dlm_pad|> (else config's pad_token_id)
  std::string precision = "bf16";      // "bf16" (mixed: f32 master weights, bf16 GEMMs) | "f32"
  bool grad_checkpointing = false;
  // Where the steps run: "cpu", "vulkan" (device 0) or "vulkan:N". On a device the weights, gradients, Adam
  // moments and activations stay in its memory (only the batch goes in and the loss and gradient norm come
  // back), in f32; a full fine-tune, or LoRA without dropout in one process (lora_dropout > 0 and LoRA over
  // ranks are refused there for now). Over ranks (`ranks`, a full fine-tune): "vulkan" is the
  // device of the rank's index on its host, "vulkan:N" every rank's, "vulkan:A,B,..." a map by that index;
  // each step then moves the gradients to the host and the weights back once, AdamW of the rank's shard on the
  // host (docs/train.md "One device per rank").
  std::string device = "cpu";
  // LoRA (lora_r > 0): train adapters over the frozen base as it is stored (bf16, or a q8 / q4 conversion for a
  // QLoRA-style run); only their A and B are trained and checkpoints are PEFT adapters (docs/lora.md).
  int64_t lora_r = 0;
  double lora_alpha = 0;               // 0: = lora_r (scale 1)
  std::string lora_targets = "all-linear";  // comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
  double lora_dropout = 0;             // in [0, 1)
  int64_t save_every = 0;              // step() also checkpoints every N steps before the last (0: only save())
  bool resume = false, force = false;  // continue out_dir's newest checkpoint / start over in a used out_dir
  uint64_t seed = 42;
  int threads = 0;                     // <= 0: all hardware threads
  // Data parallel over these ranks (null or one rank: this process alone; kept by pointer, it must outlive
  // the Trainer): each step's grad_accum micro-batches (the same global batch as one process; grad_accum a
  // multiple of the ranks) are split over the ranks and the optimizer state is sharded (ZeRO). Every rank
  // creates its Trainer with the same config and calls step(), save() and gather_rank_stats() together.
  Ranks* ranks = nullptr;
  // Benchmarking aids (`diffucoder bench --train`), so that every step does the same work and nothing is read:
  // a synthetic model instead of model_dir (then empty; f32 master weights widened from its bf16 draw, or with
  // lora_r the frozen base as drawn: bf16, q8 or q4), no checkpoints (save() refuses, resume too).
  std::optional<SyntheticModel> synthetic{};
  // > 0: instead of data_path (then empty), this many sequences of seq_len random ids drawn from seed (below
  // min(n_vocab, 150000), never the mask id), the first random_prompt_len of each a prompt (never masked), in
  // [0, seq_len).
  int64_t random_sequences = 0;
  int64_t random_prompt_len = 0;
  // > 0: every sequence masked at this ratio t, in (0, 1], instead of t ~ U(t_eps, 1).
  double mask_ratio = 0;
};

struct TrainStepStats {
  int64_t step = 0;                    // 1-based optimizer step just done
  double loss = 0, lr = 0, grad_norm = 0;  // loss of the global batch (all ranks)
  int64_t tokens = 0;                  // positions through the model in this step (all ranks)
  double seconds = 0;
  int64_t loss_rows = 0;               // masked positions scored in this step
  // The parts of `seconds`: forward_backward_seconds (the forward, the loss and the backward; forward_seconds and
  // backward_seconds its two parts, the loss in them), optimizer_seconds (clipping, AdamW, the ranks' exchange)
  // and masking_seconds (the rest: noising the batch, the step's setup and relayout_seconds, mixed precision's
  // bf16 copies of the weights made outside the optimizer: the first step's full re-layout).
  double forward_backward_seconds = 0, forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
  double relayout_seconds = 0, masking_seconds = 0;
  // The update was not applied (e.g. a non-finite gradient): the weights are the last applied step's;
  // skip_note is the warning to show, naming the step and the cause.
  bool skipped = false;
  std::string skip_note;
};

// The training data as read: sequences of seq_len tokens, lines skipped (no answer left), sequences cut.
struct TrainDataCounts {
  int64_t sequences = 0, skipped = 0, truncated = 0;
};

// One rank's memory and traffic at the end of a run (gather_rank_stats).
struct TrainRankStats {
  int64_t peak_rss_bytes = 0;          // the process's peak resident set (0 where unreadable)
  // f32, this rank's shard (a LoRA run: its adapters, their moments and gradients)
  int64_t master_weight_bytes = 0, optimizer_state_bytes = 0, gradient_bytes = 0;
  double bytes_sent_per_step = 0;      // over the step() calls of this process
};

class Trainer {
 public:
  // Loads the model (widened to f32), its tokenizer and the data; with resume, continues from out_dir's
  // newest checkpoint, refusing different options. Errors name the file or the field.
  static Result<std::unique_ptr<Trainer>> create(const TrainConfig& config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (grad_accum micro-batches): noising, forward, loss, backward, clipping, AdamW;
  // appends a line to out_dir/metrics.jsonl (and checkpoints every save_every steps before the last).
  // kResourceExhausted when memory runs out (do not step again).
  Result<TrainStepStats> step();
  // Writes out_dir/checkpoint-<step> (atomically) and out_dir/loss.svg; invalid_argument without out_dir.
  Status save();
  int64_t steps_done() const;
  std::string precision() const;       // what the steps run in: "bf16" or "f32"
  // The model's dimensions, special ids and torch_dtype, the trainer's threads and precision() (load_note empty,
  // device "cpu").
  const ModelInfo& info() const;
  int64_t parameters() const;          // the model's values, every tensor
  int64_t trainable_values() const;    // of which trained: all of them, or a LoRA run's adapters
  TrainDataCounts data_counts() const;
  // After a resume that raised steps: a line saying so (the LR schedule is stretched); else "".
  std::string resume_note() const;
  int64_t skipped_steps() const;       // steps whose update was not applied, over the whole run (resumes included)
  // The steps done so far: this object's, after those of out_dir/metrics.jsonl when resumed.
  std::vector<TrainStepStats> history() const;
  // Every rank's TrainRankStats, on every rank (rank r's at [r]; one entry without ranks). A collective:
  // every rank calls it.
  Result<std::vector<TrainRankStats>> gather_rank_stats();

  struct Impl;  // opaque: defined inside the library

 private:
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Coupled-GRPO reinforcement learning (DiffuCoder's recipe, docs/grpo.md), the `diffucoder grpo` command as
// a library: rounds of rollouts from the policy (num_generations completions per prompt by the diffusion
// sampler), rewards scored in the sandbox (the code's tests, its format) and / or by your program,
// leave-one-out advantages, num_iterations optimizer steps per round with the coupled loss against a frozen
// reference model; f32 master weights, checkpoints, bit-exact resume, data parallel over Ranks.
// GrpoTrainer::create refuses a bad value naming the field (check_grpo_config: those that need no file).
struct GrpoConfig {
  std::string model_dir;               // the policy to start from (with tokenizer.json), and the reference model's weights
  std::string data_path;               // JSONL: {"prompt" | "messages", "tests"} or AceCode {"question", "test_cases"}
  std::string out_dir;                 // checkpoints, metrics.jsonl, reward.svg; "" = write nothing
  int64_t steps = 0;                   // optimizer steps, a multiple of num_iterations; 0: one epoch (every prompt once)
  int64_t num_generations = 10;        // completions per prompt (G), in [2, 1024]
  int64_t prompts_per_round = 1;       // prompts per generation round, in [1, 4096]
  int64_t grad_accum = 2;              // micro-batches per optimizer step (the round's completions split evenly), [1, 4096]
  int64_t num_iterations = 2;          // optimizer steps per round, each with its own mask seed, [1, 1024]
  // Rollouts: the prompt's last max_prompt_length tokens, max_completion_length new tokens decoded in
  // diffusion_steps steps (entropy order); top_p applies when temperature > 0. fast: block decoding with a dual
  // KV cache and threshold commits, FASTER BUT APPROXIMATE (not the policy's own distribution; the loss still
  // scores exactly).
  int64_t max_prompt_length = 200, max_completion_length = 256;  // [1, 2^20], [1, 65536]
  int diffusion_steps = 256;           // [1, 65536]
  float temperature = 1.0f;            // [0, 100]
  float top_p = 0.95f;                 // [0, 1]
  bool fast = false;
  // A round's rollouts are generated generation_batch_size completions at a time (the recipe's
  // generation_batch_size: a multiple of num_generations, in [0, 1048576]; 0: all of a rank's round in one
  // generation), and with overlap_rewards each chunk's rewards are scored on a worker thread while the next chunk
  // is generated and the round's old and reference log-probs are computed; false scores each chunk before going
  // on. The same results either way (bit for bit); only the wall time differs.
  int64_t generation_batch_size = 0;
  bool overlap_rewards = true;
  // The optimizer (AdamW) and its schedule; warmup steps = ceil(warmup_ratio · steps) (Hugging Face's rule).
  double lr = 1e-6, min_lr_ratio = 0.1, warmup_ratio = 1e-4, weight_decay = 0.1, max_grad_norm = 0.2;
  std::string lr_schedule = "cosine";  // "constant" | "linear" | "cosine"
  double beta1 = 0.9, beta2 = 0.99, adam_eps = 1e-8;
  // The loss: beta the KL coefficient (k3 estimator against the reference model), the ratio clipped to
  // [1 − epsilon, 1 + epsilon]; scale_rewards divides the advantages by the group's reward std (+1e-4);
  // random_masking false: mask seed 42 for every iteration (else drawn per round).
  double beta = 0.01, epsilon = 0.5;
  bool scale_rewards = false, random_masking = true;
  int64_t ref_sync_steps = 64;         // mix the policy into the reference model every N steps (0: never)
  double ref_mixup_alpha = 0.6;        // ref = (1 − alpha)·ref + alpha·policy at a sync
  // Rewards (at least one on): the code reward (the share of the example's tests passed, each test case run in the
  // sandbox with these limits), the code_format reward, and your program (reward_program: an executable and its
  // arguments, JSON lines in, one score per line out; docs/grpo.md).
  double code_weight = 2.0, format_weight = 0.5;
  double test_timeout = 5.0;           // seconds per test case, [0.01, 3600]
  int reward_workers = 0;              // sandboxes at once (0: the hardware threads), [0, 1024]
  int64_t test_memory_bytes = int64_t{1} << 30, test_max_processes = 64;  // a test run's memory and processes
  std::vector<std::string> reward_program;
  double reward_weight = 1.0;
  uint64_t seed = 42;                  // the prompt order, the rollouts (seed + rank) and the mask seeds
  std::string precision = "bf16";      // "bf16" (mixed: f32 master weights, bf16 GEMMs) | "f32"
  bool grad_checkpointing = false;
  // Where the rollouts and steps run: "cpu", "vulkan" (device 0) or "vulkan:N". On a device the policy's and the
  // reference model's weights, the gradients, Adam moments and activations stay in its memory (the rewards stay on
  // the CPU), in f32; a full fine-tune, or LoRA without dropout in one process (lora_dropout > 0 and LoRA over
  // ranks are refused there for now). Over ranks (a full fine-tune): one device per rank, chosen and reduced as
  // TrainConfig::device's.
  std::string device = "cpu";
  // LoRA (lora_r > 0), as TrainConfig's: the policy is the frozen base plus the adapters, the reference model the
  // base plus a reference copy of the adapters; checkpoints are PEFT adapters.
  int64_t lora_r = 0;
  double lora_alpha = 0;
  std::string lora_targets = "all-linear";
  double lora_dropout = 0;
  int64_t save_every = 0;              // step() also checkpoints every N rounds (0: only save())
  bool resume = false, force = false;  // continue out_dir's newest checkpoint / start over in a used out_dir
  int threads = 0;                     // <= 0: all hardware threads
  // Data parallel over these ranks (as TrainConfig::ranks): each rank generates and scores whole groups with its
  // own rollout seed (seed + rank); prompts_per_round and grad_accum must be multiples of the ranks.
  Ranks* ranks = nullptr;
};

// Checks every GrpoConfig field that needs no file (ranges, names, the LoRA targets, a reward on);
// invalid_argument naming the field. GrpoTrainer::create checks them too, then the rest.
Status check_grpo_config(const GrpoConfig& config);

// One reward's unweighted scores over a round's completions: the mean and the (population) standard deviation
// of the n finite ones (a reward program may score NaN).
struct GrpoRewardStats {
  std::string name;                            // "code", "code_format" or "reward_program"
  double mean = 0, std = 0;
  int64_t n = 0;
};

struct GrpoStepStats {
  int64_t step = 0, round = 0, iteration = 0;  // 1-based optimizer step; its round and iteration (0-based)
  double loss = 0, kl = 0, clip_fraction = 0, grad_norm = 0, lr = 0;
  double reward_mean = 0, reward_std = 0;      // of the round's total rewards (all ranks)
  // Each reward that is on, over this process's completions of the round (data parallel: this rank's share).
  std::vector<GrpoRewardStats> rewards;
  // The round's rollout means (data parallel: the ranks' mean): "pass_rate" (the code reward's mean),
  // "format_rate" (the share of well-formatted completions), "rollout_tokens_per_s", "generate_seconds",
  // "reward_seconds".
  std::vector<std::pair<std::string, double>> metrics;
  int64_t rollout_tokens = 0;                  // completion tokens generated for this step's round (0 on later iterations)
  double rollout_seconds = 0, score_seconds = 0, train_seconds = 0, seconds = 0;
  bool skipped = false;                        // as TrainStepStats::skipped
  std::string skip_note;
  // The metric of that name, if the round has it.
  std::optional<double> metric(std::string_view name) const {
    for (const auto& [key, value] : metrics)
      if (key == name) return value;
    return std::nullopt;
  }
};

class GrpoTrainer {
 public:
  // Loads the tokenizer, the data, the policy (widened to f32) and the reference model; with resume, continues
  // from out_dir's newest checkpoint, refusing different options. Errors name the file or the field.
  static Result<std::unique_ptr<GrpoTrainer>> create(const GrpoConfig& config);
  ~GrpoTrainer();
  GrpoTrainer(const GrpoTrainer&) = delete;
  GrpoTrainer& operator=(const GrpoTrainer&) = delete;

  // One optimizer step; the first of a round generates and scores the rollouts. Appends a line to
  // out_dir/metrics.jsonl and checkpoints at the end of a round when save_every says so.
  Result<GrpoStepStats> step();
  // Writes out_dir/checkpoint-<step> (at a round boundary) and out_dir/reward.svg; invalid_argument without out_dir.
  Status save();
  int64_t steps_done() const;
  int64_t steps() const;               // the run's length: config.steps, or one epoch's when that is 0
  std::string precision() const;       // "bf16" or "f32"
  int64_t prompts() const;             // the data's prompts
  int64_t truncated_prompts() const;   // of which left-truncated to max_prompt_length
  std::string lora_targets() const;    // the adapted projections as a comma list ("" without LoRA)
  std::string device() const;          // where the steps run: "cpu", or the device's name ("vulkan:0 (...)")
  // How the sandbox bounds a test run (one line), when the code or format reward is on; else "".
  std::string sandbox_note() const;
  int64_t skipped_steps() const;       // over the whole run, resumes included
  // The steps done so far: this object's, after those of out_dir/metrics.jsonl when resumed (of which only step
  // and reward_mean are kept).
  std::vector<GrpoStepStats> history() const;
  // Every rank's TrainRankStats, on every rank (a collective, as Trainer::gather_rank_stats).
  Result<std::vector<TrainRankStats>> gather_rank_stats();

 private:
  struct Impl;
  explicit GrpoTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace diffucoder

// The continuous-batching engine (BatchEngine: submit requests from any thread, one forward per step).
#include <diffucoder/batch.h>  // IWYU pragma: export
