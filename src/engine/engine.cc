// Engine: loading, prompt checks and post-processing around Model::forward and generate().
#include "engine/engine.h"

#include <filesystem>

#include "tokenizer/chat.h"

namespace dc {

Result<std::unique_ptr<Engine>> Engine::load(const EngineOptions& options) {
  DC_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(options.model_dir));
  std::string tok_path = options.tokenizer_path;
  if (tok_path.empty()) {
    const std::string candidate = (std::filesystem::path(options.model_dir) / "tokenizer.json").string();
    if (std::filesystem::exists(candidate)) tok_path = candidate;
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (!tok_path.empty()) {
    DC_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_file(tok_path));
    if (tok.vocab_size() > model->config().n_vocab)
      return invalid_argument("tokenizer " + tok_path + " has " + std::to_string(tok.vocab_size()) +
                              " tokens but the model's vocab_size is " + std::to_string(model->config().n_vocab) +
                              " (tokenizer and checkpoint do not belong together)");
    tokenizer = std::make_unique<Tokenizer>(std::move(tok));
  }
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), options.n_threads));
}

SamplingParams Engine::default_params() const {
  SamplingParams p;
  const ModelConfig& c = config();
  p.mask_token_id = static_cast<int32_t>(c.mask_token_id);
  p.pad_token_id = static_cast<int32_t>(c.pad_token_id >= 0 ? c.pad_token_id : c.eos_token_id);
  p.max_position_embeddings = c.max_position_embeddings;
  return p;
}

LogitsFn Engine::logits_fn() {
  return [this](const ForwardBatch& batch, float* logits) { return model_->forward(ctx_, batch, logits); };
}

Result<std::vector<int32_t>> Engine::encode_prompt(const std::string& text, bool chat) const {
  if (tokenizer_ == nullptr)
    return not_found("no tokenizer: the model directory has no tokenizer.json; pass --tokenizer FILE or token ids");
  return tokenizer_->encode(chat ? format_instruct_prompt(text) : text);
}

Result<GenerateOutput> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                        const SamplingParams& params, GenerateHooks hooks) {
  const ModelConfig& c = config();
  if (prompts.empty()) return invalid_argument("no prompts given");
  int64_t width = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return invalid_argument("prompt " + std::to_string(i) + " is empty");
    for (int32_t id : prompts[i])
      if (id < 0 || id >= c.n_vocab)
        return invalid_argument("prompt " + std::to_string(i) + ": token id " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(c.n_vocab) + ")");
    width = std::max<int64_t>(width, prompts[i].size());
  }
  DC_RETURN_IF_ERROR(validate(params, c.n_vocab));
  DC_ASSIGN_OR_RETURN(int64_t length, canvas_length(params, width));
  if (length > c.max_position_embeddings)
    return out_of_range("the prompt (" + std::to_string(width) + " tokens) plus the new tokens make " +
                        std::to_string(length) + " positions, more than the model's context of " +
                        std::to_string(c.max_position_embeddings) +
                        " (max_position_embeddings); shorten the prompt or lower --max-new-tokens");
  if (hooks.pool == nullptr) hooks.pool = &pool_;
  return dc::generate(logits_fn(), c.n_vocab, prompts, params, hooks);
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
