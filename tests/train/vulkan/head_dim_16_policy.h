// The grpo fixtures' policy read with head_dim 16, a checkpoint directory the device trainers' tests
// (grpo_vulkan_test.cc, trainer_vulkan_test.cc, device_plan_test.cc) load, resume and save with.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "train/tiny_grpo.h"

namespace dc::train {

// The grpo fixtures' policy (hidden 32) read as 2 heads of 16 and 1 KV head: the same tensors, a head size the
// device's attention takes. Returns the directory.
inline std::string head_dim_16_policy(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path from = kGrpoDir / "policy";
  for (const char* name : {"model.safetensors", "generation_config.json"}) fs::create_symlink(from / name, fs::path(dir) / name);
  std::ifstream in(from / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["hidden_size"].get<int>(), 32);
  config["num_attention_heads"] = 2, config["num_key_value_heads"] = 1;
  std::ofstream(fs::path(dir) / "config.json") << config.dump(2);
  return dir;
}

}  // namespace dc::train
