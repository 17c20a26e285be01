// Merging a PEFT LoRA adapter into a loaded model's weights (docs/lora.md): W' = W + scale · B·A for every
// matrix the adapter targets, whole tensors for its modules_to_save, in f32, then stored as the base
// stores that matrix (f32 / f16 / bf16, the engine's q8 / q4, a GGUF block type).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "lora/adapter.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "ops/weight.h"
#include "types/model_config.h"

namespace dc {

// What merge_lora did, for the load note and `convert --lora`.
struct LoraMergeReport {
  std::vector<std::string> changed;  // the checkpoint names of the matrices replaced, in visit order
  int64_t n_updates = 0, n_replacements = 0;
};

// A model whose targeted matrices are the base's merged with `plan` (plan_lora of the adapter against
// base->config()); the other tensors stay the base's views (the base is kept alive by the result). The
// result has no checkpoint (so no packed-weight cache). Threads over rows with `pool`. Errors name the
// tensor (non-finite values); base must be unpacked (merge before Model::pack_weights).
Result<std::unique_ptr<Model>> merge_lora(std::unique_ptr<Model> base, const LoraPlan& plan, ThreadPool* pool,
                                          LoraMergeReport* report = nullptr);

// open_lora_adapter + plan_lora + merge_lora: the engine's --lora.
Result<std::unique_ptr<Model>> load_lora_merged(std::unique_ptr<Model> base, const std::string& adapter_dir,
                                                ThreadPool* pool, LoraMergeReport* report = nullptr);

}  // namespace dc
