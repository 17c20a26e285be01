// The grpo fixtures' policy read with head_dim 16, a checkpoint directory the device trainers' tests
// (grpo_vulkan_test.cc, trainer_vulkan_test.cc, device_plan_test.cc) load, resume and save with.
#pragma once

#include <string>

#include "head_dim_16.h"
#include "train/tiny_grpo.h"

namespace dc::train {

// The grpo fixtures' policy (hidden 32) read as 2 heads of 16 and 1 KV head: the same tensors, a head size the
// device's attention takes. Returns the directory.
inline std::string head_dim_16_policy(const std::string& dir) {
  testing::head_dim_16_copy(kGrpoDir / "policy", dir);
  return dir;
}

}  // namespace dc::train
