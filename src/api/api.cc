// The public facade (include/diffucoder/diffucoder.h) over Engine, the tokenizer and the sampler.
#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "api/config.h"
#include "api/model_impl.h"
#include "api/status_convert.h"
#include "api/synthetic.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "gguf/tokenizer_gguf.h"
#include "io/hub_cache.h"
#include "sampler/decoder.h"
#include "sampler/generate.h"
#include "tokenizer/chat.h"
#include "types/forward_batch.h"

namespace diffucoder {

using dc::api::sampling_params;
using dc::api::to_public;

struct Tokenizer::Impl {
  std::unique_ptr<dc::Tokenizer> owned;  // when loaded alone
  const dc::Tokenizer* tok = nullptr;    // owned, or a Model's engine's
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

namespace {

dc::Result<std::optional<dc::MatmulPrecision>> parse_precision(const std::string& name) {
  if (name == "auto") return std::optional<dc::MatmulPrecision>();
  if (name == "f32") return std::optional<dc::MatmulPrecision>(dc::MatmulPrecision::kF32);
  if (name == "bf16") return std::optional<dc::MatmulPrecision>(dc::MatmulPrecision::kBF16);
  return dc::invalid_argument("precision '" + name +
                              "' is not one of auto (the checkpoint's dtype), f32 (the reference's arithmetic), bf16");
}

int32_t id_or_none(int64_t id) { return id >= 0 && id <= INT32_MAX ? static_cast<int32_t>(id) : -1; }

// The ForwardEvent of each step (StepEvent::forward) from the sampler's on_forward. On a device the forward
// runs in its step's one submission, with the lm_head and the sampling: it is timed up to the step's end.
class ForwardTimer {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ForwardTimer(bool on_device) : on_device_(on_device), start_(Clock::now()) {}

  void forward_done(const dc::ForwardBatch& b, double ms) {
    pending_ = ForwardEvent{};
    pending_->positions = b.n_computed();
    pending_->keys = b.n_seq;
    const Clock::time_point now = Clock::now();
    since_ = now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
    if (!on_device_) end(now);
  }
  // The step's forward (none when it ran none), at the step's end.
  std::optional<ForwardEvent> step_done() {
    if (pending_ && on_device_) end(Clock::now());
    return std::exchange(pending_, std::nullopt);
  }

 private:
  void end(Clock::time_point now) {
    pending_->seconds = std::chrono::duration<double>(now - since_).count();
    pending_->ended_at = std::chrono::duration<double>(now - start_).count();
  }
  bool on_device_;
  Clock::time_point start_, since_;
  std::optional<ForwardEvent> pending_;
};

}  // namespace

void set_log_callback(LogCallback callback) {
  if (!callback) return dc::set_log_sink(nullptr);
  dc::set_log_sink([callback = std::move(callback)](dc::LogLevel level, std::string_view message) {
    callback(static_cast<LogLevel>(level), message);  // the same four levels in the same order
  });
}
static_assert(static_cast<int>(dc::LogLevel::kError) == static_cast<int>(LogLevel::kError) &&
              static_cast<int>(dc::LogLevel::kWarning) == static_cast<int>(LogLevel::kWarning) &&
              static_cast<int>(dc::LogLevel::kInfo) == static_cast<int>(LogLevel::kInfo));

Result<std::string> resolve_model_path(std::string_view name_or_path) {
  return to_public(dc::resolve_model_path(std::string(name_or_path)));
}

Result<std::unique_ptr<Model>> Model::load(const LoadOptions& options) {
  return to_public([&]() -> dc::Result<std::unique_ptr<Model>> {
    DC_ASSIGN_OR_RETURN(std::optional<dc::MatmulPrecision> precision, parse_precision(options.precision));
    if (options.threads > dc::kMaxThreads)
      return dc::invalid_argument("threads: " + std::to_string(options.threads) + " is more than the limit of " +
                                  std::to_string(dc::kMaxThreads));
    if (options.max_kv_cache_bytes <= 0)
      return dc::invalid_argument("max_kv_cache_bytes: must be > 0 (got " + std::to_string(options.max_kv_cache_bytes) + ")");
    dc::EngineOptions e;
    DC_ASSIGN_OR_RETURN(e.device, dc::parse_device(options.device));
    if (options.synthetic) return Impl::load_synthetic(options, precision, e.device);
    e.model_dir = options.model_dir;
    e.tokenizer_path = options.tokenizer_path;
    e.n_threads = options.threads;
    e.matmul_precision = precision;
    e.weight_cache = options.weight_cache;
    e.max_kv_cache_bytes = options.max_kv_cache_bytes;
    e.lora_dir = options.lora_dir;
    if (!dc::parse_lora_mode(options.lora_mode).ok())
      return dc::invalid_argument("lora_mode: '" + options.lora_mode + "' is not a LoRA mode (merged | unmerged)");
    e.lora_mode = *dc::parse_lora_mode(options.lora_mode);
    for (const LoadOptions::NamedAdapter& a : options.lora_adapters) e.lora_adapters.push_back({a.name, a.dir});
    DC_ASSIGN_OR_RETURN(std::unique_ptr<dc::Engine> engine, dc::Engine::load(e));
    dc::Engine& loaded = *engine;
    return Impl::make(loaded, std::move(engine));
  }());
}

dc::Result<std::unique_ptr<Model>> Model::Impl::load_synthetic(const LoadOptions& options,
                                                              std::optional<dc::MatmulPrecision> precision,
                                                              const dc::DeviceSpec& device) {
  if (!options.model_dir.empty())
    return dc::invalid_argument("synthetic: a synthetic model has no model_dir (got '" + options.model_dir + "')");
  if (!options.lora_dir.empty()) return dc::invalid_argument("lora_dir: not with a synthetic model (random weights)");
  DC_ASSIGN_OR_RETURN(const dc::ModelConfig config, dc::api::synthetic_config(*options.synthetic));
  dc::ThreadPool fill_pool(options.threads);
  DC_ASSIGN_OR_RETURN(std::unique_ptr<dc::Model> model, dc::api::synthetic_model(*options.synthetic, config, &fill_pool));
  DC_ASSIGN_OR_RETURN(std::unique_ptr<dc::Engine> engine,
                      dc::Engine::from_model(std::move(model), options.threads, device, options.max_kv_cache_bytes));
  DC_RETURN_IF_ERROR(engine->set_matmul_precision(precision.value_or(dc::checkpoint_precision(engine->model()))));
  dc::Engine& loaded = *engine;
  return make(loaded, std::move(engine));
}

std::unique_ptr<Model> Model::Impl::make(dc::Engine& engine, std::unique_ptr<dc::Engine> owned) {
  auto impl = std::make_unique<Impl>();
  impl->owned = std::move(owned);
  impl->engine = &engine;
  ModelInfo& info = impl->info;
  info = dc::api::model_info(engine.config());
  info.precision = engine.matmul_precision() == dc::MatmulPrecision::kBF16 ? "bf16" : "f32";
  info.load_note = engine.load_note();
  info.threads = engine.pool().n_threads();
  if (engine.backend() != nullptr) {
    info.device = engine.backend()->name();
    info.device_memory_bytes = engine.backend()->memory_bytes();
    info.device_weight_bytes = engine.backend()->weight_bytes();
  }
  if (engine.tokenizer() != nullptr) {
    auto view = std::make_unique<Tokenizer::Impl>();
    view->tok = engine.tokenizer();
    impl->tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer(std::move(view)));
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelInfo& Model::info() const { return impl_->info; }
const Tokenizer* Model::tokenizer() const { return impl_->tokenizer.get(); }

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& tokenizer_json_path) {
  dc::Result<dc::Tokenizer> tok = dc::load_tokenizer_file(tokenizer_json_path);  // tokenizer.json or .gguf
  if (!tok.ok()) return to_public(tok.status());
  auto impl = std::make_unique<Impl>();
  impl->owned = std::make_unique<dc::Tokenizer>(std::move(tok).value());
  impl->tok = impl->owned.get();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text) const { return to_public(impl_->tok->encode(text)); }

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < impl_->tok->vocab_size() && impl_->tok->id_to_token(id)) known.push_back(id);
  return to_public(impl_->tok->decode(known, skip_special_tokens));
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->tok->token_to_id(token); }

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto t = impl_->tok->id_to_token(id);
  return t ? std::optional<std::string>(std::string(*t)) : std::nullopt;
}

int32_t Tokenizer::size() const { return impl_->tok->vocab_size(); }

Result<std::vector<int32_t>> Model::encode_prompt(std::string_view text, bool chat) const {
  return to_public(impl_->engine->encode_prompt(std::string(text), chat));
}

Result<std::string> Model::apply_chat_template(const std::vector<Message>& messages, bool add_generation_prompt) {
  std::vector<dc::ChatMessage> m;
  m.reserve(messages.size());
  for (const Message& x : messages) m.push_back({x.role, x.content});
  return to_public(dc::format_chat(m, add_generation_prompt));
}

std::string Model::instruct_prompt(std::string_view query) { return dc::format_instruct_prompt(query); }

GenerationConfig Model::default_config() const { return dc::api::generation_config(impl_->engine->default_params()); }

std::vector<int32_t> Generation::generated(int64_t row) const {
  const auto begin = sequences.begin() + row * n_seq;
  return std::vector<int32_t>(begin + prompt_width, begin + n_seq);
}

Result<Generation> Model::generate(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& config,
                                   const Hooks& hooks) const {
  return to_public([&]() -> dc::Result<Generation> {
    DC_ASSIGN_OR_RETURN(dc::SamplingParams params, sampling_params(impl_->engine->default_params(), config));
    dc::GenerateHooks h;
    ForwardTimer timer(impl_->engine->backend() != nullptr);
    if (hooks.on_step) h.on_forward = [&timer](const dc::ForwardBatch& b, double ms) { timer.forward_done(b, ms); };
    if (hooks.on_step || hooks.cancel != nullptr) {
      h.on_step = [&hooks, &timer](const dc::StepInfo& s) {
        if (hooks.cancel != nullptr && hooks.cancel->load(std::memory_order_relaxed)) return false;
        if (!hooks.on_step) return true;
        return hooks.on_step(StepEvent{s.step, s.n_steps, s.n_rows, s.n_seq, s.canvas,
                                       static_cast<int64_t>(s.committed.size()), s.prompt_lengths, s.pad_counts,
                                       s.block, s.n_blocks, timer.step_done()});
      };
    }
    std::vector<int64_t> indices;  // reused across steps
    if (hooks.on_logits) {
      h.logits_hook = [&hooks, &indices](const dc::LogitsHookArgs& a) {
        indices.resize(a.positions.size());
        for (size_t i = 0; i < a.positions.size(); ++i) indices[i] = a.positions[i].row * a.n_seq + a.positions[i].position;
        hooks.on_logits(LogitsEvent{a.step, a.n_steps, a.n_rows, a.n_seq, a.n_vocab, a.canvas, indices, a.logits});
      };
    }
    if (hooks.on_tokens) {
      h.tokens_hook = [&hooks](const dc::TokensHookArgs& a) {
        hooks.on_tokens(TokensEvent{a.step, a.n_steps, a.n_rows, a.n_seq, a.canvas});
      };
    }
    DC_ASSIGN_OR_RETURN(dc::GenerateOutput out, impl_->engine->generate(prompts, params, h));
    Generation g;
    g.n_rows = out.n_rows;
    g.n_seq = out.n_seq;
    g.prompt_width = out.prompt_width;
    g.sequences.reserve(out.n_rows * out.n_seq);
    for (const auto& row : out.sequences) g.sequences.insert(g.sequences.end(), row.begin(), row.end());
    g.prompt_lengths = std::move(out.prompt_lengths);
    g.pad_counts = std::move(out.pad_counts);
    g.history = std::move(out.history);
    g.steps_run = out.timings.steps_run;
    g.forwards = out.timings.forwards;
    g.total_ms = out.timings.total_ms;
    g.forward_ms = out.timings.forward_ms;
    g.sampling_ms = out.timings.sampling_ms;
    return g;
  }());
}

Result<std::vector<float>> Model::forward(const ForwardInput& in) const {
  return to_public([&]() -> dc::Result<std::vector<float>> {
    const dc::ModelConfig& c = impl_->engine->config();
    if (in.n_batch < 1 || in.n_seq < 1)
      return dc::invalid_argument("input_ids: needs at least one row and one position (got [" +
                                  std::to_string(in.n_batch) + ", " + std::to_string(in.n_seq) + "])");
    if (in.n_seq > c.max_position_embeddings)
      return dc::out_of_range("input_ids: " + std::to_string(in.n_seq) + " positions, more than the model's context of " +
                              std::to_string(c.max_position_embeddings) + " (max_position_embeddings)");
    if (in.n_batch > dc::kMaxGenerationRows)
      return dc::out_of_range("input_ids: " + std::to_string(in.n_batch) + " rows, more than the limit of " +
                              std::to_string(dc::kMaxGenerationRows));
    const int64_t n = in.n_batch * in.n_seq;
    if (n * c.n_vocab * int64_t{4} > dc::kMaxStepLogitsBytes)
      return dc::out_of_range("input_ids: the logits of [" + std::to_string(in.n_batch) + ", " +
                              std::to_string(in.n_seq) + "] need more than " +
                              std::to_string(dc::kMaxStepLogitsBytes >> 30) + " GiB; run fewer rows or positions per call");
    if (static_cast<int64_t>(in.tokens.size()) != n)
      return dc::invalid_argument("input_ids: " + std::to_string(in.tokens.size()) + " ids for [" +
                                  std::to_string(in.n_batch) + ", " + std::to_string(in.n_seq) + "]");
    if (!in.valid.empty() && static_cast<int64_t>(in.valid.size()) != n)
      return dc::invalid_argument("attention_mask: shape differs from input_ids");
    if (!in.positions.empty() && static_cast<int64_t>(in.positions.size()) != n)
      return dc::invalid_argument("position_ids: shape differs from input_ids");
    DC_RETURN_IF_ERROR(dc::check_prompt_ids(in.tokens, c.n_vocab, "input_ids"));
    std::vector<int64_t> rows(n);
    for (int64_t i = 0; i < n; ++i) rows[i] = i;
    dc::ForwardBatch batch;
    batch.n_batch = in.n_batch;
    batch.n_seq = in.n_seq;
    batch.tokens = in.tokens.data();
    batch.valid = in.valid.empty() ? nullptr : in.valid.data();
    batch.positions = in.positions.empty() ? nullptr : in.positions.data();
    batch.out_rows = rows.data();
    batch.n_out = n;
    std::vector<float> logits;
    try {
      logits.resize(n * c.n_vocab);
    } catch (const std::bad_alloc&) {
      return dc::resource_exhausted("forward: no memory for the logits of " + std::to_string(n) + " positions");
    }
    DC_RETURN_IF_ERROR(impl_->engine->logits_fn()(batch, logits.data()));
    return logits;
  }());
}

Result<int64_t> Model::canvas_length(int64_t prompt_width, const GenerationConfig& config) const {
  return to_public([&]() -> dc::Result<int64_t> {
    DC_ASSIGN_OR_RETURN(dc::SamplingParams p, sampling_params(impl_->engine->default_params(), config));
    return dc::canvas_length_in_context(p, prompt_width, impl_->engine->config().max_position_embeddings);
  }());
}

Status Model::check_generation_size(const std::vector<std::vector<int32_t>>& prompts, const GenerationConfig& config) const {
  return to_public([&]() -> dc::Status {
    DC_ASSIGN_OR_RETURN(dc::SamplingParams p, sampling_params(impl_->engine->default_params(), config));
    return dc::check_generation_size(prompts, p, impl_->engine->config().n_vocab);
  }());
}

Status Model::check_token_ids(std::span<const int32_t> ids, const std::string& name) const {
  return to_public(dc::check_prompt_ids(ids, impl_->engine->config().n_vocab, name));
}

int64_t Model::kv_cache_bytes(int64_t rows, int64_t canvas_length) const {
  return impl_->engine->kv_cache_bytes(rows, canvas_length);
}
int64_t Model::max_kv_cache_bytes() const { return impl_->engine->max_kv_cache_bytes(); }
int64_t Model::head_block_bytes() const { return impl_->engine->head_memory().fixed_bytes; }

std::vector<int32_t> Model::stop_ids() const { return impl_->engine->stop_ids(); }

std::vector<std::string> Model::adapter_names() const { return impl_->engine->lora_adapter_names(); }

Result<std::string> Model::completion_text(std::span<const int32_t> generated) const {
  return to_public(impl_->engine->completion_text(std::vector<int32_t>(generated.begin(), generated.end())));
}

}  // namespace diffucoder

namespace dc::api {

diffucoder::ModelInfo model_info(const ModelConfig& c) {
  diffucoder::ModelInfo info;
  info.n_vocab = c.n_vocab;
  info.hidden_size = c.n_embd;
  info.n_layer = c.n_layer;
  info.n_head = c.n_head;
  info.n_head_kv = c.n_head_kv;
  info.max_position_embeddings = c.max_position_embeddings;
  info.head_dim = c.head_dim;
  info.intermediate_size = c.n_ff;
  info.mask_token_id = diffucoder::id_or_none(c.mask_token_id);
  info.pad_token_id = diffucoder::id_or_none(c.pad_token_id >= 0 ? c.pad_token_id : c.eos_token_id);
  info.eos_token_id = diffucoder::id_or_none(c.eos_token_id);
  info.bos_token_id = diffucoder::id_or_none(c.bos_token_id);
  info.torch_dtype = c.torch_dtype;
  return info;
}

std::unique_ptr<diffucoder::Model> model_over(Engine& engine) { return diffucoder::Model::Impl::make(engine, nullptr); }

}  // namespace dc::api
