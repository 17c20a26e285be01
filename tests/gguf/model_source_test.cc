// A dream GGUF wherever a model directory is accepted without an Engine (gguf/model_source.h): the f32
// trainable weights of a float file equal the directory's, a quantized file is refused for training
// by name, the tokenizer.json written from the file's metadata is the file's tokenizer, and the
// subcommands train / grpo / grpo-loss / bench --train / inspect / tokenize give on the file what they
// give on the directory it was converted from (tiny-vocab: bf16, so its BF16 file holds the same values).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../fixtures.h"
#include "../process.h"
#include "gguf/model_source.h"
#include "gguf/tokenizer_gguf.h"
#include "gguf/writer.h"
#include "gguf_model_util.h"
#include "gguf_test_util.h"
#include "io/config_json.h"

namespace dc {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::run_command;

class ModelSource : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::load_manifest();
    tmp_ = new test::TempDir("source");
    bf16_ = test::tiny_vocab_gguf(GgufWeights::kBF16, tmp_->file(""));
    q8_ = test::tiny_vocab_gguf(GgufWeights::kQ8_0, tmp_->file(""));
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string dir() { return testing::fixtures_dir() + "/tiny-vocab"; }
  static std::string bf16() { return bf16_; }
  static std::string q8() { return q8_; }
  static std::string bin() { return DC_BINARY_PATH; }
  static test::TempDir* tmp_;
  static std::string bf16_, q8_;
};
test::TempDir* ModelSource::tmp_ = nullptr;
std::string ModelSource::bf16_, ModelSource::q8_;

TEST_F(ModelSource, FloatFileTrainsFromTheDirectorysWeights) {
  ModelConfig from_dir, from_file;
  auto a = load_trainable_params(dir(), &from_dir);
  auto b = load_trainable_params(bf16(), &from_file);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(a->n_values(), b->n_values());
  EXPECT_EQ(std::memcmp(a->data(), b->data(), static_cast<size_t>(a->n_values()) * sizeof(float)), 0);
  EXPECT_EQ(from_file.n_layer, from_dir.n_layer);
  EXPECT_EQ(from_file.mask_token_id, from_dir.mask_token_id);
  EXPECT_EQ(from_file.rope_theta, from_dir.rope_theta);
  auto config = model_source_config(bf16());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->n_vocab, from_dir.n_vocab);
}

TEST_F(ModelSource, QuantizedFileIsRefusedForTrainingByName) {
  ModelConfig config;
  auto p = load_trainable_params(q8(), &config);
  ASSERT_FALSE(p.ok());
  const std::string& m = p.status().message();
  for (const char* part : {"tiny-vocab-q8_0.gguf", "'token_embd.weight' is Q8_0", "F32, F16 or BF16", "--weights bf16"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
  std::ofstream(tmp_->file("one.jsonl")) << R"({"prompt": "a", "completion": "b"})" "\n";
  const auto r = run_command(bin() + " train --model " + q8() + " --data " + tmp_->file("one.jsonl") + " --out " +
                             tmp_->file("never") + " --steps 1 --seq-len 16 --quiet");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is Q8_0"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_->file("never")));
}

TEST_F(ModelSource, TokenizerJsonOfTheFileIsItsTokenizer) {
  auto file = GgufFile::open(bf16());
  ASSERT_TRUE(file.ok());
  auto json = gguf_tokenizer_json(*file);
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  auto written = Tokenizer::from_json_text(*json, "written");
  auto metadata = model_source_tokenizer(bf16());
  auto original = model_source_tokenizer(dir());
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  ASSERT_TRUE(metadata.ok() && original.ok());
  EXPECT_EQ(written->vocab_size(), original->vocab_size());
  EXPECT_EQ(written->merges(), original->merges());
  for (const char* text : {"def f(x):\n    return x**2\n", "héllo wörld 日本語 🙂", "<|im_start|>user\nhi<|im_end|>",
                           "<|mask|>x<|endoftext|>  \n\t 1234 I'm"}) {
    auto ids = original->encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*written->encode(text), *ids) << text;
    EXPECT_EQ(*metadata->encode(text), *ids) << text;
  }
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(ModelSource, TrainOnTheFileEqualsTrainOnTheDirectory) {
  {
    std::ofstream data(tmp_->file("sft.jsonl"));
    for (int i = 0; i < 4; ++i) data << R"({"prompt": "def f)" << i << R"((x):", "completion": " return x"})" "\n";
  }
  const std::string common = " --data " + tmp_->file("sft.jsonl") +
                             " --steps 1 --seq-len 32 --batch-size 2 --threads 2 --quiet --out ";
  const auto a = run_command(bin() + " train --model " + dir() + common + tmp_->file("train-dir"));
  const auto b = run_command(bin() + " train --model " + bf16() + common + tmp_->file("train-gguf"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(Json::parse(a.out)["final_loss"], Json::parse(b.out)["final_loss"]);
  const fs::path ckpt = fs::path(tmp_->file("train-gguf")) / "checkpoint-000001";
  EXPECT_TRUE(read_bytes(ckpt / "model.safetensors") ==
              read_bytes(fs::path(tmp_->file("train-dir")) / "checkpoint-000001" / "model.safetensors"));
  // A Hugging Face directory: config.json from the file's metadata, tokenizer.json from its tokenizer.
  auto config = load_model_config((ckpt / "config.json").string());
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->torch_dtype, "float32");
  const auto tok_dir = run_command(bin() + " tokenize --model " + dir() + " --text 'def g(y): <|mask|>'");
  const auto tok_ckpt = run_command(bin() + " tokenize --model " + ckpt.string() + " --text 'def g(y): <|mask|>'");
  ASSERT_EQ(tok_ckpt.exit_code, 0) << tok_ckpt.err;
  EXPECT_EQ(tok_ckpt.out, tok_dir.out);
}

// A checkpoint trained from a GGUF keeps what the file says (the review's finding): its chat template as
// tokenizer_config.json's chat_template, and a token id the file lacks as null, not -1 (an index).
TEST_F(ModelSource, CheckpointOfAFileKeepsItsChatTemplateAndNullIds) {
  const std::string src = tmp_->file("chat-src");
  fs::copy(dir(), src, fs::copy_options::recursive);
  Json config = Json::parse(read_bytes(fs::path(src) / "config.json"));
  config["bos_token_id"] = nullptr;
  std::ofstream(fs::path(src) / "config.json") << config.dump();
  const std::string tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  std::ofstream(fs::path(src) / "tokenizer_config.json") << Json{{"chat_template", tmpl}}.dump();
  GgufConvertOptions o;
  o.model_dir = src;
  o.out_path = tmp_->file("chat.gguf");
  o.weights = GgufWeights::kBF16;
  ASSERT_TRUE(convert_to_gguf(o, &test::pool()).ok());
  std::ofstream(tmp_->file("chat.jsonl")) << R"({"prompt": "def f(x):", "completion": " return x"})" "\n";
  const auto r = run_command(bin() + " train --model " + o.out_path + " --data " + tmp_->file("chat.jsonl") +
                             " --steps 1 --seq-len 16 --batch-size 1 --threads 2 --quiet --out " + tmp_->file("train-chat"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path ckpt = fs::path(tmp_->file("train-chat")) / "checkpoint-000001";
  const Json saved = Json::parse(read_bytes(ckpt / "config.json"));
  EXPECT_TRUE(saved["bos_token_id"].is_null()) << saved.dump();
  EXPECT_EQ(saved["eos_token_id"], config["eos_token_id"]);
  EXPECT_EQ(Json::parse(read_bytes(ckpt / "tokenizer_config.json"))["chat_template"], tmpl);
}

TEST_F(ModelSource, GrpoOnTheFileEqualsGrpoOnTheDirectory) {
  std::ofstream(tmp_->file("grpo.jsonl")) << R"({"prompt": "Write f(x) returning x+1.", "tests": ["assert f(1) == 2"]})" "\n";
  std::ofstream(tmp_->file("reward.py")) << "import json, sys\n"
                                             "for line in sys.stdin:\n"
                                             "    print(json.loads(line)['completion'].count('e'))\n";
  const std::string common = " --data " + tmp_->file("grpo.jsonl") + " --num-generations 2 --max-completion-length 4 "
                             "--diffusion-steps 2 --steps 1 --num-iterations 1 --threads 2 --code-weight 0 --format-weight 0 "
                             "--reward-program /usr/bin/python3 " + tmp_->file("reward.py") + " --out ";
  const auto a = run_command(bin() + " grpo --model " + dir() + common + tmp_->file("grpo-dir"));
  const auto b = run_command(bin() + " grpo --model " + bf16() + common + tmp_->file("grpo-gguf"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  for (const char* f : {"model.safetensors", "ref_model.safetensors"}) {
    const std::string x = read_bytes(fs::path(tmp_->file("grpo-dir")) / "checkpoint-000001" / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == read_bytes(fs::path(tmp_->file("grpo-gguf")) / "checkpoint-000001" / f)) << f;
  }
  const auto q = run_command(bin() + " grpo --model " + q8() + common + tmp_->file("grpo-q8"));
  EXPECT_EQ(q.exit_code, 1);
  EXPECT_NE(q.err.find("is Q8_0"), std::string::npos) << q.err;
}

TEST_F(ModelSource, GrpoLossAndBenchTrainReadTheFile) {
  // No im_end_id: the completion mask takes <|im_end|> from the model's tokenizer (the file's metadata).
  std::ofstream(tmp_->file("batch.json"))
      << R"({"prompt_ids": [[5, 6, 7]], "completion_ids": [[8, 9, 10, 11], [12, 13, 14, 15]], "rewards": [0, 1],)"
         R"( "group_size": 2, "t": 0.5, "mask": [[1, 0, 1, 0], [0, 1, 0, 1]]})";
  const std::string batch = " --json --threads 2 --batch " + tmp_->file("batch.json");
  const auto a = run_command(bin() + " grpo-loss --model " + dir() + batch);
  const auto b = run_command(bin() + " grpo-loss --model " + bf16() + batch);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  const std::string bench = " --train --seq-len 32 --prompt-len 8 --steps 1 --threads 2 --no-peak --json";
  const auto c = run_command(bin() + " bench --model " + dir() + bench);
  const auto d = run_command(bin() + " bench --model " + bf16() + bench);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(Json::parse(c.out)["losses"], Json::parse(d.out)["losses"]) << c.out << d.out;
}

TEST_F(ModelSource, InspectAndTokenizeReadTheFile) {
  const auto a = run_command(bin() + " inspect --json --model " + dir());
  const auto b = run_command(bin() + " inspect --json --model " + q8());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const Json x = Json::parse(a.out), y = Json::parse(b.out);
  EXPECT_EQ(x["parameters"], y["parameters"]);
  EXPECT_EQ(x["parameter_groups"], y["parameter_groups"]);
  EXPECT_EQ(x["config"]["mask_token_id"], y["config"]["mask_token_id"]);
  EXPECT_EQ(x["config"]["num_hidden_layers"], y["config"]["num_hidden_layers"]);
  EXPECT_TRUE(y["tensor_dtypes"].contains("Q8_0")) << y.dump();
  EXPECT_TRUE(y["tensor_dtypes"].contains("F32")) << y.dump();  // norms and biases
  EXPECT_EQ(y["files"], 1);
  EXPECT_EQ(y["weight_bytes"].get<int64_t>() > 0, true);
  const auto text = run_command(bin() + " inspect --model " + q8());
  EXPECT_NE(text.out.find("Q8_0"), std::string::npos) << text.out;

  const std::string words = " --text 'def add(a, b):\n    return a + b <|im_end|>'";
  const auto t_dir = run_command(bin() + " tokenize --model " + dir() + words);
  ASSERT_EQ(t_dir.exit_code, 0) << t_dir.err;
  for (const std::string& source : {" --model " + q8(), " --tokenizer " + bf16()}) {
    const auto t = run_command(bin() + " tokenize" + source + words);
    EXPECT_EQ(t.exit_code, 0) << t.err;
    EXPECT_EQ(t.out, t_dir.out) << source;
    const auto back = run_command(bin() + " tokenize --decode" + source + " --text '" + Json::parse(t.out).dump() + "'");
    EXPECT_NE(back.out.find("return a + b"), std::string::npos) << back.out << back.err;
  }
  const auto missing = run_command(bin() + " tokenize --model " + tmp_->file("missing.gguf") + " --text x");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("missing.gguf"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace dc
