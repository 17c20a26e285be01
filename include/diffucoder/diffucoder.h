// The public C++ API of diffucoder.cpp: load a DiffuCoder / Dream checkpoint, tokenize, generate with
// per-step callbacks (streaming the canvas), hook logits and tokens, plug in an unmasking policy.
//
//   auto engine = dc::Engine::load({.model_dir = "DiffuCoder-7B-Instruct"});   // Result<...>
//   auto ids = (*engine)->encode_prompt("Write quicksort.", /*chat=*/true);
//   dc::SamplingParams p = (*engine)->default_params();
//   p.max_new_tokens = 256; p.steps = 256; p.alg = dc::Algorithm::kEntropy; p.temperature = 0;
//   auto out = (*engine)->generate({*ids}, p, {.on_step = [](const dc::StepInfo& s) { return true; }});
//   auto text = (*engine)->completion_text(out->generated[0]);
#pragma once

#include "engine/engine.h"
