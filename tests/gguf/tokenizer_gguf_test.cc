// The tokenizer of a GGUF (tokenizer.ggml.* written by our converter from tokenizer.json, llama.cpp's
// layout) equals the tokenizer.json one: same tokens, flags, merges, ids and texts on a corpus; and an
// Engine loads FILE.gguf (weights + tokenizer) and generates what the directory generates.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../fixtures.h"
#include "../process.h"
#include "engine/engine.h"
#include "gguf/tokenizer_gguf.h"
#include "gguf/writer.h"
#include "gguf_model_util.h"
#include "gguf_test_util.h"

namespace dc {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Source files of the repository plus hand-picked edge cases (Unicode, white space, added tokens).
std::vector<std::string> corpus() {
  std::vector<std::string> texts = {
      "héllo wörld ñ 日本語 🙂 \u00e9\u0301", "  \n\n\t x\r\n  y   ", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
      "<|mask|><|mask|>x<|endoftext|>", "1234567 3.14159 0xFF", "I'm you'LL they'RE", "def f(x):\n    return x**2\n",
      "\xF0\x9F\x98\x80\xF0\x9F\x98\x81", ""};
  for (const char* f : {"README.md", "tests/reference/dream_ref.py", "src/gguf/quants.cc", "tests/tokenizer/make_goldens.js"})
    texts.push_back(read_file(std::string(DC_SOURCE_DIR) + "/" + f));
  return texts;
}

class GgufTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::load_manifest();
    tmp_ = new test::TempDir("tok");
    path_ = test::tiny_vocab_gguf(GgufWeights::kBF16, tmp_->file(""));
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string dir() { return testing::fixtures_dir() + "/tiny-vocab"; }
  static std::string path() { return path_; }
  static test::TempDir* tmp_;
  static std::string path_;
};
test::TempDir* GgufTokenizer::tmp_ = nullptr;
std::string GgufTokenizer::path_;

TEST_F(GgufTokenizer, EqualsTheTokenizerJsonOne) {
  auto file = GgufFile::open(path());
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(*file->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*file->get_string("tokenizer.ggml.pre"), "qwen2");
  auto g = gguf_tokenizer(*file);
  auto j = Tokenizer::from_file(dir() + "/tokenizer.json");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  ASSERT_EQ(g->vocab_size(), j->vocab_size());
  EXPECT_EQ(file->find("tokenizer.ggml.tokens")->n, 152064u);  // padded to the embedding rows as llama.cpp does
  for (int32_t id = 0; id < j->vocab_size(); ++id) {
    ASSERT_EQ(g->id_to_token(id), j->id_to_token(id)) << "id " << id;
    ASSERT_EQ(g->is_special(id), j->is_special(id)) << "id " << id;
  }
  EXPECT_EQ(g->merges(), j->merges());
  size_t checked = 0;
  for (const std::string& text : corpus()) {
    auto a = g->encode(text);
    auto b = j->encode(text);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(*a, *b) << "text of " << text.size() << " bytes: " << text.substr(0, 60);
    EXPECT_EQ(*g->decode(*a), *j->decode(*b));
    checked += a->size();
  }
  EXPECT_GT(checked, 5000u);
  auto mask = j->token_to_id("<|mask|>");
  if (mask) {
    EXPECT_EQ(*file->get_int("tokenizer.ggml.mask_token_id"), *mask);
  }
}

TEST_F(GgufTokenizer, BadTokenizerMetadataIsNamed) {
  GgufWriter w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "llama-bpe");
  ASSERT_TRUE(w.write(tmp_->file("pre.gguf")).ok());
  auto f = GgufFile::open(tmp_->file("pre.gguf"));
  ASSERT_TRUE(f.ok());
  auto t = gguf_tokenizer(*f);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.ggml.pre is 'llama-bpe'"), std::string::npos) << t.status().to_string();
  GgufWriter u;
  u.add_string("tokenizer.ggml.model", "gpt2");
  u.add_string("tokenizer.ggml.pre", "qwen2");
  u.add_strings("tokenizer.ggml.tokens", {"a", "b"});
  u.add_strings("tokenizer.ggml.merges", {});
  u.add_i32s("tokenizer.ggml.token_type", {1});
  ASSERT_TRUE(u.write(tmp_->file("types.gguf")).ok());
  auto g = GgufFile::open(tmp_->file("types.gguf"));
  ASSERT_TRUE(g.ok());
  t = gguf_tokenizer(*g);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("token_type has 1 entries but tokenizer.ggml.tokens has 2"), std::string::npos)
      << t.status().to_string();
}

TEST_F(GgufTokenizer, EngineLoadsTheFileAndGeneratesAsTheDirectory) {
  EngineOptions o;
  o.n_threads = 2;
  o.weight_cache = "off";
  o.matmul_precision = MatmulPrecision::kF32;
  o.model_dir = dir();
  auto from_dir = Engine::load(o);
  o.model_dir = path();
  auto from_gguf = Engine::load(o);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().to_string();
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().to_string();
  ASSERT_NE((*from_gguf)->tokenizer(), nullptr);
  auto prompt = (*from_gguf)->encode_prompt("def add(a, b):", /*chat=*/true);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, *(*from_dir)->encode_prompt("def add(a, b):", true));
  SamplingParams p = (*from_gguf)->default_params();
  p.max_new_tokens = 8;
  p.steps = 4;
  p.seed = 7;
  auto a = (*from_gguf)->generate({*prompt}, p);
  auto b = (*from_dir)->generate({*prompt}, p);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sequences, b->sequences);
  EXPECT_EQ(*(*from_gguf)->completion_text(a->generated[0]), *(*from_dir)->completion_text(b->generated[0]));
  // A directory's weights with the GGUF file as the tokenizer.
  o.model_dir = dir();
  o.tokenizer_path = path();
  auto mixed = Engine::load(o);
  ASSERT_TRUE(mixed.ok()) << mixed.status().to_string();
  EXPECT_EQ(*(*mixed)->encode_prompt("def add(a, b):", true), *prompt);
}

TEST_F(GgufTokenizer, CliConvertsAndGeneratesFromTheFile) {
  const std::string bin = DC_BINARY_PATH;
  const std::string out = tmp_->file("cli.gguf");
  using testing::run_command;
  auto r = run_command(bin + " convert --model " + dir() + " --out " + out + " --weights q8_0 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("token_embd.weight"), std::string::npos) << r.err;  // progress per tensor
  r = run_command(bin + " convert --model " + dir() + " --out " + out + " --weights q8_0 --quiet");
  EXPECT_EQ(r.exit_code, 2);  // exists without --force
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = run_command(bin + " convert --model " + dir() + " --out " + out + " --weights q4 --force");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k or q6_k"), std::string::npos)
      << r.err;
  r = run_command(bin + " generate --model " + out + " --prompt 'def f():' --steps 2 --max-new-tokens 4 --threads 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_command(bin + " convert --model " + dir() + " --out " + out + " --weights q5_1 --force --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(" Q5_1\n"), std::string::npos) << r.err;  // the matrices (64 or 32 columns) are Q5_1
  r = run_command(bin + " generate --model " + out + " --prompt 'def f():' --steps 2 --max-new-tokens 4 --threads 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  test::write_bytes(tmp_->file("junk.gguf"), {'G', 'G', 'U', 'F', 9, 0, 0, 0});
  r = run_command(bin + " generate --model " + tmp_->file("junk.gguf") + " --prompt x --steps 1 --max-new-tokens 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("GGUF version 9"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dc
