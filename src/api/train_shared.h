// What the facade's Trainer (train.cc) and GrpoTrainer (grpo.cc) share: the optimizer's and LoRA's fields
// checked by name, and every rank's memory and traffic gathered at the end of a run.
#pragma once

#include <diffucoder/diffucoder.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "dist/comm.h"
#include "lora/trainable.h"
#include "ops/device.h"
#include "train/optimizer_core.h"

namespace dc::api {

// "field: must be <rule>, got <value>" when a number breaks its rule (NaN breaks every rule).
Status check_number(bool ok, const char* field, const char* rule, double value);

// The AdamW and schedule fields of TrainConfig and GrpoConfig, under those names.
struct OptimizerFields {
  double lr, min_lr_ratio, weight_decay, max_grad_norm, beta1, beta2, adam_eps;
};
Status check_optimizer_fields(const OptimizerFields& f);

// The LoRA fields (lora_r 0: none, an empty spec) as a checked LoraSpec; errors name the flag.
Result<LoraSpec> lora_spec(int64_t r, double alpha, const std::string& targets, double dropout);

// This rank's TrainRankStats (the trainer's footprint `held`, bytes sent over `steps_here` steps) and, over
// `comm` (null: this process alone), every rank's, in rank order.
Result<std::vector<diffucoder::TrainRankStats>> gather_rank_stats(dist::Comm* comm, const train::TrainFootprint& held,
                                                                   int64_t steps_here);

// Opens this rank's device of --device `spec` (parse_rank_device: `vulkan` is the device of the rank's index on
// its host, `vulkan:N` every rank's, `vulkan:A,B,...` a map) into *backend and sets ctx's device to it; "cpu"
// leaves both. `comm`: the ranks (null: one process). A device that does not exist is refused naming the rank,
// its local rank and the device.
Status open_rank_device(const std::string& spec, const dist::Comm* comm, std::unique_ptr<DeviceBackend>* backend,
                        Context* ctx);

}  // namespace dc::api
