// Checkpoint directories: a single model.safetensors, sharded checkpoints with an index, and the
// errors for missing files, inconsistent indexes and duplicated tensors.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "io/io_test_util.h"

namespace dc {
namespace {

using dc::test::TempDir;
using dc::testing::expect_error;
using dc::testing::write_bytes;
using Json = nlohmann::json;

const char* kTinyConfig = R"({"model_type": "Dream", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "mask_token_id": 15,
  "pad_token_id": 14, "bos_token_id": 14, "eos_token_id": 14, "tie_word_embeddings": true})";

// Tensors with recognisable contents: element i of tensor k is 100 * k + i.
struct TensorSet {
  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;

  void add(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(100 * values.size() + i);
    values.push_back(std::move(v));
    tensors.push_back({name, DType::kF32, std::move(shape), values.back().data()});
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { write_bytes(dir_.file("config.json"), kTinyConfig); }

  // Two shards: embed + norm in the first, the layer in the second, and the index.
  void write_sharded(const Json& extra_map = Json::object()) {
    TensorSet a, b;
    a.add("model.embed_tokens.weight", {16, 8});
    a.add("model.norm.weight", {8});
    b.add("model.layers.0.mlp.up_proj.weight", {12, 8});
    ASSERT_TRUE(write_safetensors(dir_.file("model-00001-of-00002.safetensors"), a.tensors).ok());
    ASSERT_TRUE(write_safetensors(dir_.file("model-00002-of-00002.safetensors"), b.tensors).ok());
    Json index = {{"metadata", {{"total_size", 4 * (128 + 8 + 96)}}},
                  {"weight_map",
                   {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                    {"model.norm.weight", "model-00001-of-00002.safetensors"},
                    {"model.layers.0.mlp.up_proj.weight", "model-00002-of-00002.safetensors"}}}};
    for (const auto& [k, v] : extra_map.items()) index["weight_map"][k] = v;
    write_bytes(dir_.file("model.safetensors.index.json"), index.dump(2));
  }

  TempDir dir_;
};

TEST_F(CheckpointTest, SingleFile) {
  TensorSet set;
  set.add("model.embed_tokens.weight", {16, 8});
  set.add("model.norm.weight", {8});
  ASSERT_TRUE(write_safetensors(dir_.file("model.safetensors"), set.tensors).ok());
  auto ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->dir(), dir_.path());
  EXPECT_EQ(ckpt->config().n_vocab, 16);
  EXPECT_EQ(ckpt->config().head_dim, 4);
  EXPECT_TRUE(ckpt->config().tie_word_embeddings);
  EXPECT_FALSE(ckpt->generation_config().present);
  EXPECT_EQ(ckpt->tensors().size(), 2u);
  EXPECT_EQ(ckpt->files().size(), 1u);
  EXPECT_EQ(ckpt->total_bytes(), 4u * (128 + 8));
  const TensorInfo* norm = ckpt->find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->shape, std::vector<int64_t>{8});
  EXPECT_EQ(norm->file, dir_.file("model.safetensors"));
  EXPECT_EQ(static_cast<const float*>(norm->data)[3], 103.0f);
  EXPECT_EQ(ckpt->find("lm_head.weight"), nullptr);

  // Moving the checkpoint keeps the mapped data where it was.
  Checkpoint moved = std::move(ckpt).value();
  EXPECT_EQ(static_cast<const float*>(moved.find("model.embed_tokens.weight")->data)[127], 127.0f);
}

TEST_F(CheckpointTest, ShardedWithIndexAndGenerationConfig) {
  write_sharded();
  write_bytes(dir_.file("generation_config.json"), R"({"alg": "entropy", "steps": 64, "eos_token_id": [14]})");
  auto ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->files().size(), 2u);
  EXPECT_EQ(ckpt->tensors().size(), 3u);
  EXPECT_EQ(ckpt->total_bytes(), 4u * (128 + 8 + 96));
  EXPECT_TRUE(ckpt->generation_config().present);
  EXPECT_EQ(ckpt->generation_config().alg, "entropy");
  EXPECT_EQ(ckpt->generation_config().steps, 64);
  EXPECT_EQ(ckpt->generation_config().eos_token_id, 14);
  const TensorInfo* up = ckpt->find("model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->file, dir_.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(up->shape, (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(static_cast<const float*>(up->data)[95], 95.0f);
  EXPECT_EQ(static_cast<const float*>(ckpt->find("model.norm.weight")->data)[0], 100.0f);
}

TEST_F(CheckpointTest, MissingDirectoryConfigOrWeights) {
  expect_error(Checkpoint::open(dir_.file("nope")).status(), {"nope", "directory"});
  Status s = Checkpoint::open(dir_.path()).status();
  expect_error(s, {"no model.safetensors or model.safetensors.index.json in " + dir_.path()});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  std::filesystem::remove(dir_.file("config.json"));
  expect_error(Checkpoint::open(dir_.path()).status(), {"config.json", dir_.path()});
}

TEST_F(CheckpointTest, BadConfigOrGenerationConfigNamesTheFile) {
  write_sharded();
  write_bytes(dir_.file("config.json"), R"({"num_attention_heads": "two"})");
  expect_error(Checkpoint::open(dir_.path()).status(), {dir_.file("config.json"), "num_attention_heads"});
  write_bytes(dir_.file("config.json"), kTinyConfig);
  write_bytes(dir_.file("generation_config.json"), R"({"steps": "many"})");
  expect_error(Checkpoint::open(dir_.path()).status(), {dir_.file("generation_config.json"), "steps"});
}

TEST_F(CheckpointTest, IndexNamesMissingShard) {
  write_sharded({{"lm_head.weight", "model-00003-of-00003.safetensors"}});
  Status s = Checkpoint::open(dir_.path()).status();
  expect_error(s, {"model-00003-of-00003.safetensors", "lm_head.weight", "missing"});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, IndexNamesTensorAbsentFromShard) {
  write_sharded({{"lm_head.weight", "model-00002-of-00002.safetensors"}});
  expect_error(Checkpoint::open(dir_.path()).status(),
               {"lm_head.weight", "model-00002-of-00002.safetensors", "does not contain"});
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  write_sharded();
  TensorSet extra;
  extra.add("model.norm.weight", {8});
  extra.add("lm_head.weight", {16, 8});
  ASSERT_TRUE(write_safetensors(dir_.file("model-00002-of-00002.safetensors"),
                                {extra.tensors[0], extra.tensors[1],
                                 {"model.layers.0.mlp.up_proj.weight", DType::kF32, {0}, nullptr}})
                  .ok());
  expect_error(Checkpoint::open(dir_.path()).status(),
               {"model.norm.weight", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"});
}

TEST_F(CheckpointTest, MalformedIndex) {
  write_sharded();
  const std::string index = dir_.file("model.safetensors.index.json");
  write_bytes(index, "{\"weight_map\": ");
  expect_error(Checkpoint::open(dir_.path()).status(), {index, "not valid JSON"});
  write_bytes(index, R"({"metadata": {}})");
  expect_error(Checkpoint::open(dir_.path()).status(), {index, "weight_map"});
  write_bytes(index, R"({"weight_map": {}})");
  expect_error(Checkpoint::open(dir_.path()).status(), {index, "empty"});
  write_bytes(index, R"({"weight_map": {"w": 3}})");
  expect_error(Checkpoint::open(dir_.path()).status(), {index, "'w'"});
  write_bytes(index, R"({"weight_map": {"w": "../outside.safetensors"}})");
  expect_error(Checkpoint::open(dir_.path()).status(), {index, "'w'", "inside the checkpoint directory"});
  write_bytes(index, R"({"weight_map": {"w": "/etc/passwd"}})");
  expect_error(Checkpoint::open(dir_.path()).status(), {index, "'w'"});
}

TEST_F(CheckpointTest, CorruptShardNamesTheShard) {
  write_sharded();
  write_bytes(dir_.file("model-00002-of-00002.safetensors"), "garbage!garbage!");
  expect_error(Checkpoint::open(dir_.path()).status(), {dir_.file("model-00002-of-00002.safetensors"), "header"});
}

TEST_F(CheckpointTest, SingleFileWinsOverIndex) {
  write_sharded({{"lm_head.weight", "missing.safetensors"}});  // a broken index that must not be read
  TensorSet set;
  set.add("model.norm.weight", {8});
  ASSERT_TRUE(write_safetensors(dir_.file("model.safetensors"), set.tensors).ok());
  auto ckpt = Checkpoint::open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->tensors().size(), 1u);
}

}  // namespace
}  // namespace dc
