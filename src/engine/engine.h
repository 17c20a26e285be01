// Engine: a loaded model, its tokenizer and a thread pool, with the glue between them: the model as
// the sampler's LogitsFn, prompt encoding (plain or chat), and the post-processing of completions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/transformer.h"
#include "sampler/generate.h"
#include "tokenizer/tokenizer.h"

namespace dc {

struct EngineOptions {
  std::string model_dir;       // a Hugging Face checkpoint directory
  std::string tokenizer_path;  // "" = model_dir/tokenizer.json when it exists (else no tokenizer)
  int n_threads = 0;           // <= 0: all hardware threads
};

class Engine {
 public:
  // Loads and checks the checkpoint and, when present, the tokenizer. Errors name the file.
  static Result<std::unique_ptr<Engine>> load(const EngineOptions& options);
  // An engine over a model already in memory (e.g. a synthetic benchmark model); no tokenizer.
  static std::unique_ptr<Engine> from_model(std::unique_ptr<Model> model, int n_threads) {
    return std::unique_ptr<Engine>(new Engine(std::move(model), nullptr, n_threads));
  }

  const Model& model() const { return *model_; }
  const ModelConfig& config() const { return model_->config(); }
  // nullptr when the checkpoint has no tokenizer.json and none was given.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  ThreadPool& pool() { return pool_; }

  // The reference's effective defaults (sampler/generate.h) with this model's mask / pad ids and
  // context length. generation_config.json is NOT applied, as in the reference (spec §3.2).
  SamplingParams default_params() const;

  // The model as the sampler sees it. Valid while the Engine lives.
  LogitsFn logits_fn();

  // Encodes a prompt; with `chat`, wraps it in the Instruct format first (tokenizer/chat.h).
  // Errors when there is no tokenizer or the text is not valid UTF-8.
  Result<std::vector<int32_t>> encode_prompt(const std::string& text, bool chat) const;

  // Checks the prompts against the vocabulary and the context length, then runs the sampler with the
  // engine's thread pool. Errors name the prompt index.
  Result<GenerateOutput> generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                  GenerateHooks hooks = {});

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

  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ThreadPool pool_;
  Context ctx_;
};

}  // namespace dc
