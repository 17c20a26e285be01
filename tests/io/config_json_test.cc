// config.json and generation_config.json parsing: the DiffuCoder config, defaults, nulls and lists,
// and every kind of wrong type or invalid value rejected with the field and the file named.
#include "io/config_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/io_test_util.h"

namespace dc {
namespace {

using dc::test::TempDir;
using dc::testing::write_bytes;
using Json = nlohmann::json;

const char* kPath = "/models/x/config.json";

// DiffuCoder-7B-Instruct's config.json (dream-reference.md §1.1).
Json diffucoder_config() {
  return Json::parse(R"({
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "mask_token_id": 151666,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "Dream",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "pad_token_id": 151643,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.3",
    "use_cache": false, "use_mrope": false, "use_sliding_window": false, "vocab_size": 152064})");
}

Result<ModelConfig> parse(const Json& j) { return parse_model_config(j.dump(), kPath); }

// Expects failure with a message that names the file and every needle.
void expect_config_error(const Status& status, std::initializer_list<std::string> needles) {
  testing::expect_error(status, needles);
  EXPECT_NE(status.message().find(kPath), std::string::npos) << "message lacks the path: " << status.message();
}

// The DiffuCoder config with `key` set to `value` (null Json erases nothing; use erase for that).
Json with(const std::string& key, const Json& value) {
  Json j = diffucoder_config();
  j[key] = value;
  return j;
}

TEST(ModelConfigJson, DiffuCoderConfig) {
  auto c = parse(diffucoder_config());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->model_type, "Dream");
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_EQ(c->n_vocab, 152064);
  EXPECT_EQ(c->n_embd, 3584);
  EXPECT_EQ(c->n_ff, 18944);
  EXPECT_EQ(c->n_layer, 28);
  EXPECT_EQ(c->n_head, 28);
  EXPECT_EQ(c->n_head_kv, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->mask_token_id, 151666);
  EXPECT_EQ(c->pad_token_id, 151643);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_id, 151643);
}

TEST(ModelConfigJson, EmptyObjectGivesDreamDefaults) {
  auto c = parse_model_config("{}", kPath);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const ModelConfig d;
  EXPECT_EQ(c->n_vocab, 151936);
  EXPECT_EQ(c->n_embd, 4096);
  EXPECT_EQ(c->n_ff, 22016);
  EXPECT_EQ(c->n_layer, 32);
  EXPECT_EQ(c->n_head, 32);
  EXPECT_EQ(c->n_head_kv, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->mask_token_id, d.mask_token_id);
  EXPECT_EQ(c->model_type, d.model_type);
}

TEST(ModelConfigJson, HeadDimGivenOrDerived) {
  Json j = diffucoder_config();
  j["head_dim"] = 64;  // explicit, hidden_size need not equal heads * head_dim
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->head_dim, 64);
  j["head_dim"] = nullptr;
  c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->head_dim, 128);
  j["hidden_size"] = 3600;  // 3600 % 28 != 0 but head_dim given
  j["head_dim"] = 128;
  EXPECT_TRUE(parse(j).ok());
}

TEST(ModelConfigJson, NullAndListTokenIds) {
  Json j = diffucoder_config();
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = Json::array({151645, 151643});
  j["pad_token_id"] = Json::array();
  j["num_key_value_heads"] = nullptr;  // Qwen2Config: null -> num_attention_heads
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->eos_token_id, 151645);
  EXPECT_EQ(c->pad_token_id, -1);
  EXPECT_EQ(c->n_head_kv, 28);
}

TEST(ModelConfigJson, DTypeKeyFallbackAndNullTorchDType) {
  Json j = diffucoder_config();
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  auto c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->torch_dtype, "float16");
  j = with("torch_dtype", nullptr);
  c = parse(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->torch_dtype, "bfloat16");
}

TEST(ModelConfigJson, RopeScalingAndSlidingWindow) {
  EXPECT_TRUE(parse(with("rope_scaling", {{"rope_type", "default"}})).ok());
  EXPECT_TRUE(parse(with("rope_scaling", {{"type", "default"}})).ok());
  Json sliding = with("sliding_window", 4096);  // ignored while use_sliding_window is false
  EXPECT_TRUE(parse(sliding).ok());

  Status s = parse(with("rope_scaling", {{"type", "linear"}, {"factor", 2.0}})).status();
  expect_config_error(s, {"rope_scaling", "linear"});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  expect_config_error(parse(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}})).status(),
               {"rope_scaling", "yarn"});
  expect_config_error(parse(with("rope_scaling", {{"factor", 4.0}})).status(), {"rope_scaling", "rope_type"});
  expect_config_error(parse(with("rope_scaling", "yarn")).status(), {"rope_scaling", "object"});
  s = parse(with("use_sliding_window", true)).status();
  expect_config_error(s, {"use_sliding_window"});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  expect_config_error(parse(with("use_mrope", true)).status(), {"use_mrope"});
  s = parse(with("hidden_act", "gelu")).status();
  expect_config_error(s, {"hidden_act", "gelu", "silu"});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
}

TEST(ModelConfigJson, NotJsonOrNotAnObject) {
  Status s = parse_model_config("{\"vocab_size\": 12,", kPath).status();
  expect_config_error(s, {"not valid JSON"});
  EXPECT_EQ(s.code(), StatusCode::kParseError);
  expect_config_error(parse_model_config("", kPath).status(), {"not valid JSON"});
  expect_config_error(parse_model_config("[1, 2]", kPath).status(), {"JSON object", "array"});
  expect_config_error(parse_model_config("{\"rope_theta\": NaN}", kPath).status(), {"not valid JSON"});
}

struct BadField {
  std::string key;
  Json value;
  std::string expected;  // a phrase the message must contain besides the key
};

TEST(ModelConfigJson, WrongTypesNameTheFieldAndExpectedType) {
  const std::vector<BadField> cases = {
      {"vocab_size", "152064", "an integer"},       {"hidden_size", 3584.5, "an integer"},
      {"intermediate_size", 18944.0, "an integer"}, {"num_hidden_layers", true, "an integer"},
      {"num_attention_heads", Json::array({28}), "an integer"},
      {"num_key_value_heads", "4", "an integer"},   {"head_dim", "128", "an integer"},
      {"max_position_embeddings", nullptr, "an integer"},
      {"rope_theta", "1e6", "a number"},            {"rms_norm_eps", nullptr, "a number"},
      {"tie_word_embeddings", "false", "true or false"}, {"tie_word_embeddings", 0, "true or false"},
      {"mask_token_id", "151666", "an integer, null or a list"},
      {"eos_token_id", Json::array({151643, "x"}), "an integer, null or a list"},
      {"bos_token_id", 1.5, "an integer, null or a list"},
      {"hidden_act", 1, "a string"},                {"model_type", nullptr, "a string"},
      {"torch_dtype", 16, "a string or null"},      {"architectures", "DreamModel", "a list of strings"},
      {"architectures", Json::array({1}), "a list of strings"},
      {"attention_dropout", "0", "a number"},       {"sliding_window", "4096", "an integer"},
      {"use_sliding_window", 0, "true or false"},   {"use_mrope", "no", "true or false"},
      {"rope_scaling", 3, "null or an object"},     {"vocab_size", 18446744073709551615ull, "64-bit"},
  };
  for (const BadField& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value.dump());
    expect_config_error(parse(with(c.key, c.value)).status(), {"\"" + c.key + "\"", c.expected});
  }
}

TEST(ModelConfigJson, InvalidValuesNameTheField) {
  const std::vector<BadField> cases = {
      {"vocab_size", 0, "positive"},          {"hidden_size", -3584, "positive"},
      {"intermediate_size", 0, "positive"},   {"num_hidden_layers", 0, "positive"},
      {"num_attention_heads", 0, "positive"}, {"num_key_value_heads", 0, "positive"},
      {"head_dim", 0, "positive"},            {"head_dim", 127, "even"},
      {"max_position_embeddings", -1, "positive"},
      {"num_key_value_heads", 5, "divide"},   {"hidden_size", 3585, "divisible"},
      {"mask_token_id", 152064, "vocab_size"}, {"eos_token_id", -2, "vocab_size"},
      {"pad_token_id", Json::array({200000}), "vocab_size"},
      {"rms_norm_eps", 0, "> 0"},             {"rms_norm_eps", -1e-6, "> 0"},
      {"rope_theta", -1.0, "> 0"},            {"rope_theta", 0, "> 0"},
  };
  for (const BadField& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value.dump());
    expect_config_error(parse(with(c.key, c.value)).status(), {"\"" + c.key + "\"", c.expected});
  }
}

TEST(ModelConfigJson, OverflowingNumberIsRejected) {
  // 1e999 is valid JSON text but not a finite double; the parser reports where it is.
  expect_config_error(parse_model_config("{\"rope_theta\": 1e999}", kPath).status(), {"not valid JSON", "1e999"});
}

TEST(ModelConfigJson, LoadFromFile) {
  TempDir dir;
  const std::string path = dir.file("config.json");
  write_bytes(path, diffucoder_config().dump(2));
  auto c = load_model_config(path);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->n_layer, 28);
  auto missing = load_model_config(dir.file("nope.json"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);
  write_bytes(path, "{\"hidden_size\": \"big\"}");
  Status s = load_model_config(path).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s.message();
}

// ---- generation_config.json --------------------------------------------------------------------------

TEST(GenerationConfigJson, DreamFile) {
  auto g = parse_generation_config(R"({"_from_model_config": true, "alg": "origin", "alg_temp": null,
      "bos_token_id": 151643, "eos_token_id": 151643, "eps": 0.001, "mask_token_id": null,
      "output_history": false, "pad_token_id": 151643, "steps": 512, "temperature": 0.0, "top_k": null,
      "top_p": null, "transformers_version": "4.46.2"})",
                                   kPath);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(g->present);
  EXPECT_EQ(g->alg, "origin");
  EXPECT_EQ(g->alg_temp, -1);
  EXPECT_EQ(g->eps, 0.001);
  EXPECT_EQ(g->steps, 512);
  EXPECT_EQ(g->temperature, 0.0);
  EXPECT_EQ(g->top_k, -1);
  EXPECT_EQ(g->top_p, -1);
  EXPECT_EQ(g->mask_token_id, -1);
  EXPECT_EQ(g->bos_token_id, 151643);
  EXPECT_EQ(g->max_new_tokens, -1);
}

TEST(GenerationConfigJson, EmptyObjectAndLists) {
  auto g = parse_generation_config(R"({"eos_token_id": [151645, 151643], "top_p": 0.95, "top_k": 20,
      "max_new_tokens": 256, "max_length": 1024, "alg": null})", kPath);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->eos_token_id, 151645);
  EXPECT_EQ(g->top_p, 0.95);
  EXPECT_EQ(g->top_k, 20);
  EXPECT_EQ(g->max_new_tokens, 256);
  EXPECT_EQ(g->max_length, 1024);
  EXPECT_EQ(g->alg, "");
  auto empty = parse_generation_config("{}", kPath);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->present);
  EXPECT_EQ(empty->temperature, -1);
}

TEST(GenerationConfigJson, BadFields) {
  const std::vector<BadField> cases = {
      {"alg", 3, "a string or null"},      {"temperature", "0.2", "a number"},
      {"steps", 12.5, "an integer"},        {"top_k", "5", "an integer"},
      {"eos_token_id", "x", "an integer"}, {"temperature", -0.5, ">= 0"},
      {"steps", -1, ">= 0"},                {"top_p", 1.5, "[0, 1]"},
      {"pad_token_id", -7, ">= 0"},
  };
  for (const BadField& c : cases) {
    SCOPED_TRACE(c.key + " = " + c.value.dump());
    Json j = Json::object();
    j[c.key] = c.value;
    expect_config_error(parse_generation_config(j.dump(), kPath).status(), {"\"" + c.key + "\"", c.expected});
  }
  expect_config_error(parse_generation_config("not json", kPath).status(), {"not valid JSON"});
}

}  // namespace
}  // namespace dc
