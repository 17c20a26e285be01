// What the facade's classes share of a loaded Model (api.cc defines it; batch.cc's BatchEngine reads its
// engine), and a Model over an Engine the caller
// loaded (the server tests': engines they load as the other layers' tests do, served through the facade).
#pragma once

#include <diffucoder/diffucoder.h>

#include <memory>

#include "core/status.h"
#include "engine/engine.h"

namespace diffucoder {

struct Model::Impl {
  std::unique_ptr<dc::Engine> owned;     // Model::load's engine; null in a view of the caller's (model_over)
  dc::Engine* engine = nullptr;          // owned, or the caller's
  ModelInfo info;
  std::unique_ptr<Tokenizer> tokenizer;  // a view of the engine's, when it has one

  // A Model over `engine` (= *owned when owned is set) with its info and tokenizer.
  static std::unique_ptr<Model> make(dc::Engine& engine, std::unique_ptr<dc::Engine> owned);
  // Model::load of options.synthetic (precision: nullopt for "auto"; device parsed).
  static dc::Result<std::unique_ptr<Model>> load_synthetic(const LoadOptions& options,
                                                           std::optional<dc::MatmulPrecision> precision,
                                                           const dc::DeviceSpec& device);
  // The Impl of `model` (for the layers above the facade that reach below it: measure.h).
  static const Impl& of(const Model& model) { return *model.impl_; }
};

}  // namespace diffucoder

namespace dc::api {

// The dimensions and special ids of `config` (torch_dtype too; precision, load_note, threads and device left
// as ModelInfo's defaults).
diffucoder::ModelInfo model_info(const ModelConfig& config);

// A Model whose calls run on `engine`, which the caller owns and keeps alive longer than the Model.
std::unique_ptr<diffucoder::Model> model_over(Engine& engine);

}  // namespace dc::api
