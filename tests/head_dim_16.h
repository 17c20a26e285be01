// A tiny checkpoint of hidden size 32 read as 2 attention heads of 16 and 1 KV head: the same tensors, a head
// size the Vulkan device's attention takes (16..128). The device tests' copies of tiny-vocab, of the grpo
// fixtures' policy and of the GRPO learning tests' base are made with it.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace dc::testing {

// Links `from`'s model.safetensors, tokenizer.json and generation_config.json (those it has) into `dir` and
// writes its config.json there with 2 heads and 1 KV head.
inline void head_dim_16_copy(const std::filesystem::path& from, const std::filesystem::path& dir) {
  for (const char* name : {"model.safetensors", "tokenizer.json", "generation_config.json"})
    if (std::filesystem::exists(from / name)) std::filesystem::create_symlink(from / name, dir / name);
  std::ifstream in(from / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["hidden_size"].get<int>(), 32) << from;
  config["num_attention_heads"] = 2, config["num_key_value_heads"] = 1;
  std::ofstream(dir / "config.json") << config.dump(2);
}

}  // namespace dc::testing
