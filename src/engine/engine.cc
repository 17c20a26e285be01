// Engine: loading, prompt checks and post-processing around Model::forward and generate().
#include "engine/engine.h"

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>

#include "core/cpu_level.h"
#include "core/log.h"
#include "engine/device_head_sampler.h"
#include "engine/head_sampler.h"
#include "gguf/dream.h"
#include "gguf/tokenizer_gguf.h"
#include "lora/adapter.h"
#include "lora/merge.h"
#include "model/kv_cache.h"
#include "model/weight_cache.h"
#include "tokenizer/chat.h"

namespace dc {

namespace {

// A GGUF file (gguf/dream.h): its weights, and its tokenizer when the file has one and none was given.
Status load_gguf(const EngineOptions& options, std::unique_ptr<Model>* model, std::optional<Tokenizer>* tokenizer) {
  ThreadPool pool(options.n_threads);  // checks the quantized blocks' scales
  DC_ASSIGN_OR_RETURN(GgufModel m, load_gguf_model(options.model_dir, &pool));
  if (options.tokenizer_path.empty() && gguf_has_tokenizer(*m.file)) {
    DC_ASSIGN_OR_RETURN(*tokenizer, gguf_tokenizer(*m.file));
  }
  *model = Model::from_weights(std::move(m.config), std::move(m.weights), std::move(m.storage));
  return Status::ok_status();
}

// An adapter held unmerged over a model of `config` (LoraParams::from_adapter; errors name its files).
Result<std::unique_ptr<LoraParams>> load_unmerged(const std::string& dir, const ModelConfig& config) {
  DC_ASSIGN_OR_RETURN(LoraAdapter adapter, open_lora_adapter(dir));
  DC_ASSIGN_OR_RETURN(LoraParams params, LoraParams::from_adapter(adapter, config));
  return std::make_unique<LoraParams>(std::move(params));
}

// The unmerged adapters' options checked before anything loads: the names.
Status check_lora_options(const EngineOptions& options) {
  if (!options.lora_adapters.empty() && !options.lora_dir.empty())
    return invalid_argument("--lora: a bare adapter directory (" + options.lora_dir +
                            ") cannot be combined with named adapters (NAME=DIR): name every adapter");
  for (size_t i = 0; i < options.lora_adapters.size(); ++i) {
    const NamedLora& a = options.lora_adapters[i];
    if (a.name.empty() || a.dir.empty())
      return invalid_argument("--lora: '" + a.name + "=" + a.dir + "' needs a name and a directory (NAME=DIR)");
    for (size_t j = 0; j < i; ++j)
      if (options.lora_adapters[j].name == a.name)
        return invalid_argument("--lora: the name '" + a.name + "' is given twice");
  }
  return Status::ok_status();
}

}  // namespace

Result<LoraMode> parse_lora_mode(const std::string& text) {
  if (text == "merged") return LoraMode::kMerged;
  if (text == "unmerged") return LoraMode::kUnmerged;
  return invalid_argument("--lora-mode: '" + text + "' is not a LoRA mode (merged | unmerged)");
}

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  // A misspelt DC_CPU_LEVEL would silently cap the kernels at the baseline: refuse it before the load.
  DC_RETURN_IF_ERROR(check_cpu_level_env());
  DC_RETURN_IF_ERROR(check_lora_options(options));
  const bool gguf = is_gguf_path(options.model_dir);
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tok;
  std::string tok_path = options.tokenizer_path;
  if (gguf) {
    DC_RETURN_IF_ERROR(load_gguf(options, &model, &tok));
    if (tok) tok_path = options.model_dir + " (its tokenizer.ggml metadata)";
  } else {
    DC_ASSIGN_OR_RETURN(model, Model::load(options.model_dir));
    if (tok_path.empty()) {
      const std::string candidate = (std::filesystem::path(options.model_dir) / "tokenizer.json").string();
      if (std::filesystem::exists(candidate)) tok_path = candidate;
    }
  }
  std::string lora_note;
  const bool merge = !options.lora_dir.empty() && options.lora_mode == LoraMode::kMerged;
  std::unique_ptr<LoraParams> unmerged;
  std::vector<std::pair<std::string, std::unique_ptr<LoraParams>>> adapters;
  if (!options.lora_dir.empty() && !merge) {  // held beside the untouched base
    DC_ASSIGN_OR_RETURN(unmerged, load_unmerged(options.lora_dir, model->config()));
    lora_note = "LoRA " + options.lora_dir + " unmerged on " + std::to_string(unmerged->tensors().size() / 2) + " matrices";
  }
  for (const NamedLora& a : options.lora_adapters) {
    DC_ASSIGN_OR_RETURN(std::unique_ptr<LoraParams> p, load_unmerged(a.dir, model->config()));
    lora_note += std::string(lora_note.empty() ? "LoRA " : ", ") + a.name + " = " + a.dir + " unmerged on " +
                 std::to_string(p->tensors().size() / 2) + " matrices";
    adapters.emplace_back(a.name, std::move(p));
  }
  if (merge) {  // merged before any packing, cache or device upload
    ThreadPool pool(options.n_threads);
    LoraMergeReport report;
    DC_ASSIGN_OR_RETURN(model, load_lora_merged(std::move(model), options.lora_dir, &pool, &report));
    lora_note = "LoRA " + options.lora_dir + " merged into " + std::to_string(report.n_updates) + " matrices" +
                (report.n_replacements > 0 ? " (+ " + std::to_string(report.n_replacements) + " replaced whole)" : "");
  }
  if (!tok && !tok_path.empty()) {
    DC_ASSIGN_OR_RETURN(tok, load_tokenizer_file(tok_path));
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (tok) {
    if (tok->vocab_size() > model->config().n_vocab)
      return invalid_argument("tokenizer " + tok_path + " has " + std::to_string(tok->vocab_size()) +
                              " tokens but the model's vocab_size is " + std::to_string(model->config().n_vocab) +
                              " (tokenizer and checkpoint do not belong together)");
    tokenizer = std::make_unique<Tokenizer>(std::move(*tok));
  }
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), options.n_threads));
  engine->max_kv_cache_bytes_ = options.max_kv_cache_bytes;
  engine->lora_note_ = std::move(lora_note);
  engine->unmerged_lora_ = std::move(unmerged);
  if (engine->unmerged_lora_) engine->model_->set_lora(&engine->unmerged_lora_->weights());  // every forward adds it
  engine->adapters_ = std::move(adapters);
  engine->ctx_.matmul_precision = options.matmul_precision.value_or(checkpoint_precision(*engine->model_));
  if (options.device.device != Device::kCpu) {  // the device keeps its own row-major copy: nothing to pack
    DC_RETURN_IF_ERROR(engine->use_device(options.device));
    return engine;
  }
  std::string cache_path;
  // A GGUF model, or one with a LoRA merged, is packed at each load (no cache file); an unmerged one keeps
  // the base as it is, so its cache.
  if (options.weight_cache != "off" && !gguf && !merge) {
    const std::string precision = engine->ctx_.matmul_precision == MatmulPrecision::kBF16 ? "bf16" : "f32";
    cache_path = options.weight_cache.empty() ? default_weight_cache_path(options.model_dir, precision)
                                              : weight_cache_path_in(options.weight_cache, options.model_dir, precision);
  }
  engine->pack_or_note(cache_path);
  return engine;
}

MatmulPrecision checkpoint_precision(const Model& model) {
  bool any_dense = false;
  for (const LayerWeights& l : model.weights().layers)
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      if (w->quantized()) continue;
      if (w->dtype == DType::kBF16) return MatmulPrecision::kBF16;
      any_dense = true;
    }
  if (!any_dense && model.config().torch_dtype == "bfloat16") return MatmulPrecision::kBF16;
  return MatmulPrecision::kF32;
}

Result<std::unique_ptr<Engine>> Engine::from_model(std::unique_ptr<Model> model, int n_threads, const DeviceSpec& device,
                                                   int64_t max_kv_cache_bytes) {
  std::unique_ptr<Engine> engine;
  if (device.device == Device::kCpu) {
    engine = from_model(std::move(model), n_threads);
  } else {
    engine = std::unique_ptr<Engine>(new Engine(std::move(model), nullptr, n_threads));
    DC_RETURN_IF_ERROR(engine->use_device(device));
  }
  engine->max_kv_cache_bytes_ = max_kv_cache_bytes;
  return engine;
}

Status Engine::use_device(const DeviceSpec& device) {
  if (device.device == Device::kCpu) return Status();
  DC_ASSIGN_OR_RETURN(backend_, open_vulkan_backend(device.index));
  Context device_ctx = ctx_;
  device_ctx.device = device.device, device_ctx.backend = backend_.get();
  backend_->set_matrix_units(ctx_.matmul_precision == MatmulPrecision::kBF16);
  DC_RETURN_IF_ERROR(model_->to_device(device_ctx));
  // The unmerged adapters, each uploaded once and kept while the engine lives (a forward finds them there).
  std::vector<const LoraParams*> adapters;
  if (unmerged_lora_ != nullptr) adapters.push_back(unmerged_lora_.get());
  for (const auto& a : adapters_) adapters.push_back(a.second.get());
  int64_t adapter_bytes = 0;
  for (const LoraParams* p : adapters) adapter_bytes += p->n_values() * static_cast<int64_t>(sizeof(float));
  if (adapter_bytes > backend_->memory_bytes() - backend_->weight_bytes())
    return resource_exhausted("the unmerged LoRA adapters need " + std::to_string(adapter_bytes >> 20) + " MiB on " +
                              backend_->name() + " beside the weights' " + std::to_string(backend_->weight_bytes() >> 20) +
                              " MiB, more than its " + std::to_string(backend_->memory_bytes() >> 20) +
                              " MiB: load fewer adapters, merge one (--lora-mode merged) or use --device cpu");
  const std::unique_lock<std::mutex> lock = backend_->lock();
  for (const LoraParams* p : adapters) DC_RETURN_IF_ERROR(model_->lora_to_device(device_ctx, p->weights()));
  ctx_ = device_ctx;
  return Status();
}

Status Engine::set_matmul_precision(MatmulPrecision precision) {
  {
    const std::lock_guard<std::mutex> lock(gate_mutex_);
    if (generations_ > 0 || repacking_)
      return failed_precondition("set_matmul_precision: a generation is running on this engine (" +
                           std::to_string(generations_) + " generate call(s) or logits / head functions alive) or "
                           "the precision is being changed; change it when none is");
    repacking_ = true;
    ctx_.matmul_precision = precision;
  }
  Status s;
  if (backend_ != nullptr) {  // the device's own copy: kBF16 allows its matrix units
    backend_->set_matrix_units(precision == MatmulPrecision::kBF16);
  } else {
    s = model_->pack_weights(ctx_);
  }
  {
    const std::lock_guard<std::mutex> lock(gate_mutex_);
    repacking_ = false;
  }
  gate_cv_.notify_all();
  return s;
}

MatmulPrecision Engine::matmul_precision() const {
  const std::lock_guard<std::mutex> lock(gate_mutex_);
  return ctx_.matmul_precision;
}

std::shared_ptr<void> Engine::begin_generation() {
  std::unique_lock<std::mutex> lock(gate_mutex_);
  gate_cv_.wait(lock, [this] { return !repacking_; });
  ++generations_;
  return std::shared_ptr<void>(this, [](Engine* e) {
    const std::lock_guard<std::mutex> end(e->gate_mutex_);
    --e->generations_;
  });
}

std::string Engine::load_note() const {
  const WeightCacheReport& c = weight_cache_report_;
  if (backend_ != nullptr)
    return "device vulkan (" + backend_->name() + "), " + std::to_string(backend_->weight_bytes() >> 20) +
           " MiB of weights on it, " + backend_->arithmetic() + " arithmetic" +
           (lora_note_.empty() ? std::string() : "; " + lora_note_);
  std::string note = std::string("matmul precision ") + (matmul_precision() == MatmulPrecision::kBF16 ? "bf16" : "f32");
  if (!lora_note_.empty()) note += "; " + lora_note_;
  if (!c.note.empty()) note += "; " + c.note + ", rebuilding it";
  if (c.outcome == WeightCacheReport::kLoaded) note += "; packed weights mapped from " + c.path;
  if (c.outcome == WeightCacheReport::kWriting)
    note += "; writing the packed weights (" + std::to_string(c.bytes >> 20) + " MiB) to " + c.path +
            " in the background, the next start maps them";
  return note;
}

void Engine::pack_or_note(const std::string& cache_path) {
  Status s = cache_path.empty() ? model_->pack_weights(ctx_) : model_->pack_weights(ctx_, cache_path, &weight_cache_report_);
  if (!s.ok())
    dc::log(LogLevel::kWarning, "some weights left unpacked, their GEMMs will be slower: " + s.message());
}

SamplingParams Engine::default_params() const {
  SamplingParams p;
  const ModelConfig& c = config();
  p.mask_token_id = static_cast<int32_t>(c.mask_token_id);
  p.pad_token_id = static_cast<int32_t>(c.pad_token_id >= 0 ? c.pad_token_id : c.eos_token_id);
  p.max_position_embeddings = c.max_position_embeddings;
  return p;
}

namespace {

int64_t kv_bytes(const ModelConfig& c, int64_t n_rows, int64_t n_seq) {
  return KvCache::bytes_for(c.n_layer, n_rows, n_seq, c.n_head_kv * c.head_dim);
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(int64_t{1} << 30));
  return buf;
}

Status kv_cache_too_large(int64_t bytes, int64_t limit, int64_t n_rows, int64_t n_seq) {
  return out_of_range("KV cache: " + std::to_string(n_rows) + " rows × " + std::to_string(n_seq) +
                      " positions need " + gib(bytes) + " of keys and values, more than the limit of " + gib(limit) +
                      " (EngineOptions::max_kv_cache_bytes); use cache none, fewer rows or fewer new tokens");
}

// One generation's KV cache and forward scratch (one generation at a time), freed with its function.
struct Generation {
  KvCache cache;
  Workspace workspace;
};

// `batch` with the generation's `cache` when its cache_op needs one and it brings none; a refresh larger
// than max_kv_cache_bytes is refused.
Result<ForwardBatch> with_cache(const Model& model, int64_t max_kv_cache_bytes, KvCache& cache,
                                const ForwardBatch& batch) {
  if (batch.cache_op == CacheOp::kNone || batch.cache != nullptr) return batch;
  if (batch.cache_op == CacheOp::kRefresh) {
    const int64_t bytes = kv_bytes(model.config(), batch.n_batch, batch.n_seq);
    if (bytes > max_kv_cache_bytes) return kv_cache_too_large(bytes, max_kv_cache_bytes, batch.n_batch, batch.n_seq);
  }
  ForwardBatch b = batch;
  b.cache = &cache;
  return b;
}

LogitsFn model_logits_fn(const Model& model, const Context& ctx, int64_t max_kv_cache_bytes) {
  auto gen = std::make_shared<Generation>();
  return [&model, ctx, max_kv_cache_bytes, gen](const ForwardBatch& batch, float* logits) -> Status {
    Context call_ctx = ctx;
    call_ctx.workspace = &gen->workspace;
    DC_ASSIGN_OR_RETURN(const ForwardBatch b, with_cache(model, max_kv_cache_bytes, gen->cache, batch));
    return model.forward(call_ctx, b, logits);
  };
}

HeadFn model_head_fn(const Model& model, const Context& ctx, int64_t max_kv_cache_bytes) {
  auto cache = std::make_shared<KvCache>();  // the forward's scratch is the head's own workspace
  // On a device the hidden rows stay there, and greedy steps are sampled there (DeviceHeadSampler).
  std::shared_ptr<HeadSampler> head;
  std::function<Status(const ForwardBatch&)> forward;
  if (ctx.device != Device::kCpu) {
    auto device_head = std::make_shared<DeviceHeadSampler>(model, ctx);
    head = device_head;
    forward = [device_head](const ForwardBatch& b) { return device_head->forward(b); };
  } else {
    auto cpu_head = std::make_shared<CpuHeadSampler>(model, ctx);
    head = cpu_head;
    forward = [cpu_head](const ForwardBatch& b) { return cpu_head->forward(b); };
  }
  return [&model, max_kv_cache_bytes, cache, head, forward](const ForwardBatch& batch) -> Result<HeadSampler*> {
    DC_ASSIGN_OR_RETURN(const ForwardBatch b, with_cache(model, max_kv_cache_bytes, *cache, batch));
    DC_RETURN_IF_ERROR(forward(b));
    return head.get();
  };
}

}  // namespace

int64_t Engine::kv_cache_bytes(int64_t n_rows, int64_t n_seq) const { return kv_bytes(config(), n_rows, n_seq); }

LogitsFn Engine::logits_fn() {
  std::shared_ptr<void> running = begin_generation();  // held by the function: no re-pack while it lives
  LogitsFn fn = model_logits_fn(*model_, ctx_, max_kv_cache_bytes_);
  return [fn = std::move(fn), running](const ForwardBatch& batch, float* logits) { return fn(batch, logits); };
}

HeadFn Engine::head_fn() {
  std::shared_ptr<void> running = begin_generation();
  HeadFn fn = model_head_fn(*model_, ctx_, max_kv_cache_bytes_);
  return [fn = std::move(fn), running](const ForwardBatch& batch) { return fn(batch); };
}

PartsHeadFn Engine::parts_head_fn() {
  std::shared_ptr<void> running = begin_generation();
  // On a device the parts' hidden rows stay there and every step is sampled there, as head_fn()'s.
  std::shared_ptr<HeadSampler> head;
  std::function<Status(std::span<const ForwardBatch>)> forward;
  if (ctx_.device != Device::kCpu) {
    auto device_head = std::make_shared<DeviceHeadSampler>(*model_, ctx_);
    head = device_head;
    forward = [device_head](std::span<const ForwardBatch> parts) { return device_head->forward(parts); };
  } else {
    auto cpu_head = std::make_shared<CpuHeadSampler>(*model_, ctx_);
    head = cpu_head;
    forward = [cpu_head](std::span<const ForwardBatch> parts) { return cpu_head->forward(parts); };
  }
  return [this, head, forward, running](std::span<const ForwardBatch> parts) -> Result<HeadSampler*> {
    for (size_t p = 0; p < parts.size(); ++p) {
      const ForwardBatch& b = parts[p];
      const int64_t bytes = kv_bytes(config(), b.n_batch, b.n_seq);
      if (b.cache_op == CacheOp::kRefresh && bytes > max_kv_cache_bytes_)
        return kv_cache_too_large(bytes, max_kv_cache_bytes_, b.n_batch, b.n_seq).with_context("part " + std::to_string(p));
    }
    DC_RETURN_IF_ERROR(forward(parts));
    return head.get();
  };
}

HeadMemory Engine::head_memory() const {
  // On a device every step is sampled there (DeviceHeadSampler): the host holds a few numbers per position,
  // the device a hidden row and a logits row per sampled position, the forward's activations per computed
  // position and a job's KV cache: what the server's budget weighs there (serve --device: the device's memory).
  if (ctx_.device != Device::kCpu) {
    const ModelConfig& c = config();
    return HeadMemory{DeviceHeadSampler::kHostBytesPerPosition + kSamplerBytesPerPosition +
                          (c.n_embd + c.n_vocab) * static_cast<int64_t>(sizeof(float)),
                      0, model_->forward_bytes_per_position(), kv_bytes(c, 1, 1)};
  }
  return HeadMemory{config().n_embd * static_cast<int64_t>(sizeof(float)) + kSamplerBytesPerPosition,
                    CpuHeadSampler::chunk_bytes(*model_)};
}

Result<std::vector<int32_t>> Engine::encode_prompt(const std::string& text, bool chat) const {
  if (tokenizer_ == nullptr)
    return not_found("no tokenizer: the model directory has no tokenizer.json; pass --tokenizer FILE or token ids");
  // A text longer than the context times the longest token cannot fit: refuse it before tokenising it.
  const int64_t bytes = static_cast<int64_t>(text.size());
  const int64_t max_bytes = config().max_position_embeddings * tokenizer_->max_token_bytes();
  if (bytes > max_bytes)
    return out_of_range("the prompt is " + std::to_string(bytes) + " bytes, so at least " +
                        std::to_string(bytes / tokenizer_->max_token_bytes()) +
                        " tokens, more than the model's context of " + std::to_string(config().max_position_embeddings) +
                        " (max_position_embeddings); shorten the prompt");
  return tokenizer_->encode(chat ? format_instruct_prompt(text) : text);
}

Status check_cache_on_device(const SamplingParams& params, const DeviceBackend* device) {
  if (params.cache != CacheMode::kCommitted || device == nullptr) return Status();
  return invalid_argument("cache: \"committed\" runs on the CPU only (its steps compute scattered positions, which "
                          "the device kernels do not take); on " + device->name() + " use cache \"dual\", or --device cpu");
}

Result<GenerateOutput> generate_on_model(const Model& model, const Context& ctx, int64_t max_kv_cache_bytes,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const SamplingParams& params, GenerateHooks hooks) {
  const ModelConfig& c = model.config();
  if (prompts.empty()) return invalid_argument("no prompts given");
  int64_t width = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return invalid_argument("prompt " + std::to_string(i) + " is empty");
    DC_RETURN_IF_ERROR(check_prompt_ids(prompts[i], c.n_vocab, "prompt " + std::to_string(i)));
    width = std::max<int64_t>(width, prompts[i].size());
  }
  DC_RETURN_IF_ERROR(validate(params, c.n_vocab));
  DC_RETURN_IF_ERROR(check_cache_on_device(params, ctx.backend));
  DC_ASSIGN_OR_RETURN(int64_t length, canvas_length_in_context(params, width, c.max_position_embeddings));
  if (params.cache != CacheMode::kNone) {
    const int64_t rows = static_cast<int64_t>(prompts.size()) * params.num_return_sequences;
    const int64_t bytes = kv_bytes(c, rows, length);
    if (bytes > max_kv_cache_bytes) return kv_cache_too_large(bytes, max_kv_cache_bytes, rows, length);
  }
  if (hooks.pool == nullptr) hooks.pool = ctx.pool;
  return dc::generate(model_head_fn(model, ctx, max_kv_cache_bytes), c.n_vocab, prompts, params, hooks);
}

Result<GenerateOutput> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                        const SamplingParams& params, GenerateHooks hooks) {
  const std::shared_ptr<void> running = begin_generation();  // ctx_ and the weights stay as they are
  Context ctx = ctx_;
  ctx.profiler = profiler_;
  return generate_on_model(*model_, ctx, max_kv_cache_bytes_, prompts, params, std::move(hooks));
}

const LoraWeights* Engine::lora_adapter(const std::string& name) const {
  for (const auto& [n, p] : adapters_)
    if (n == name) return &p->weights();
  return nullptr;
}

std::vector<std::string> Engine::lora_adapter_names() const {
  std::vector<std::string> names;
  for (const auto& a : adapters_) names.push_back(a.first);
  return names;
}

std::vector<int32_t> Engine::stop_ids() const {
  if (tokenizer_ != nullptr) {
    if (auto pad = tokenizer_->token_to_id("<|dlm_pad|>")) {
      std::vector<int32_t> ids = {*pad};
      if (auto im_end = tokenizer_->token_to_id("<|im_end|>")) ids.push_back(*im_end);
      return ids;
    }
  }
  if (config().eos_token_id >= 0) return {static_cast<int32_t>(config().eos_token_id)};
  return {};
}

Result<std::string> Engine::completion_text(const std::vector<int32_t>& generated) const {
  if (tokenizer_ == nullptr) return not_found("no tokenizer: cannot decode the completion to text");
  // The embedding has more rows than the tokenizer has tokens (152064 vs 151668 for DiffuCoder) and
  // the model can pick an unused row; Hugging Face's decode drops such ids, and so do we.
  std::vector<int32_t> ids;
  for (int32_t id : truncate_at_stop(generated, stop_ids()))
    if (id < tokenizer_->vocab_size()) ids.push_back(id);
  return tokenizer_->decode(ids);
}

}  // namespace dc
