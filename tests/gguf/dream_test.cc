// Dream GGUF files against the safetensors checkpoints they come from: our converter's F32 / BF16 / F16
// files give identical logits, the quantized ones (ours: Q8_0, Q4_K; hand-made random blocks: Q4_0,
// Q5_K, Q6_K, Q8_0) stay within stated bounds; missing tensors and foreign metadata give clear errors.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>

#include "../fixtures.h"
#include "core/dtype.h"
#include "gguf/quants.h"
#include "gguf/tokenizer_gguf.h"
#include "gguf/writer.h"
#include "gguf_model_util.h"
#include "gguf_test_util.h"
#include "io/checkpoint.h"
#include "model/quantize.h"

namespace dc {
namespace {

using test::load_gguf;
using test::logits_of;
using test::relative_error;

std::string fixture(const std::string& name) { return testing::fixtures_dir() + "/" + name; }

// Converts `dir` to `weights` at `out` and returns the GGUF's logits next to the directory's.
struct Pair {
  std::vector<float> gguf, dir;
};
Pair convert_and_compare(const std::string& dir, const std::string& out, GgufWeights weights) {
  GgufConvertOptions o;
  o.model_dir = dir;
  o.out_path = out;
  o.weights = weights;
  const Status s = convert_to_gguf(o, &test::pool());
  EXPECT_TRUE(s.ok()) << s.to_string();
  auto g = load_gguf(out);
  auto d = Model::load(dir);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  if (!g.ok() || !d.ok()) return {};
  EXPECT_EQ((*g)->config().n_layer, (*d)->config().n_layer);
  EXPECT_EQ((*g)->config().mask_token_id, (*d)->config().mask_token_id);
  EXPECT_EQ((*g)->config().rope_theta, (*d)->config().rope_theta);
  return {logits_of(**g), logits_of(**d)};
}

TEST(GgufDream, F32AndBf16FilesGiveTheDirectorysLogits) {
  testing::load_manifest();
  test::TempDir tmp("dense");
  for (const auto& [name, weights] : std::vector<std::pair<std::string, GgufWeights>>{
           {"tiny-gqa1", GgufWeights::kF32}, {"tiny-gqa2", GgufWeights::kF32}, {"tiny-gqa4-bf16", GgufWeights::kBF16}}) {
    SCOPED_TRACE(name);
    const Pair p = convert_and_compare(fixture(name), tmp.file(name + ".gguf"), weights);
    ASSERT_FALSE(p.dir.empty());
    EXPECT_EQ(p.gguf, p.dir);
  }
}

// The f32 fixture `name` with every matrix rounded to f16 (norms and biases kept f32, as GGUF files keep
// them), written as a checkpoint directory `out`.
void write_f16_copy(const std::string& name, const std::string& out) {
  auto src = Checkpoint::open(fixture(name));
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  std::vector<std::vector<uint16_t>> halves;
  std::vector<TensorToWrite> tensors;
  for (const auto& [tensor, t] : src->tensors()) {
    if (t.shape.size() < 2) {
      tensors.push_back({tensor, t.dtype, t.shape, t.data});
      continue;
    }
    std::vector<float> f(t.n_bytes / 4);
    convert_to_f32(t.dtype, t.data, f.data(), f.size());
    std::vector<uint16_t>& h = halves.emplace_back(f.size());
    for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_f16(f[i]);
  }
  size_t k = 0;
  for (const auto& [tensor, t] : src->tensors())
    if (t.shape.size() >= 2) tensors.push_back({tensor, DType::kF16, t.shape, halves[k++].data()});
  std::filesystem::create_directories(out);
  std::filesystem::copy_file(fixture(name) + "/config.json", out + "/config.json");
  ASSERT_TRUE(write_safetensors(out + "/model.safetensors", tensors).ok());
}

TEST(GgufDream, F16FileGivesTheF16DirectorysLogits) {
  testing::load_manifest();
  test::TempDir tmp("f16");
  write_f16_copy("tiny-gqa1", tmp.file("f16dir"));
  const Pair p = convert_and_compare(tmp.file("f16dir"), tmp.file("f16.gguf"), GgufWeights::kF16);
  ASSERT_FALSE(p.dir.empty());
  EXPECT_EQ(p.gguf, p.dir);
}

// Files of the independent numpy writer (tests/reference/gguf_np.py: alignment 64, other key order and
// value types, tensors sorted by name) give the directories' logits exactly.
TEST(GgufDream, IndependentWriterFilesGiveTheDirectorysLogits) {
  testing::load_manifest();
  test::TempDir tmp("np");
  write_f16_copy("tiny-gqa1", tmp.file("f16dir"));
  const std::string np = DC_GGUF_NP_DIR;
  for (const auto& [file, dir] : std::vector<std::pair<std::string, std::string>>{
           {np + "/tiny-gqa1.f32.gguf", fixture("tiny-gqa1")},
           {np + "/tiny-gqa2.f32.gguf", fixture("tiny-gqa2")},
           {np + "/tiny-gqa4-bf16.bf16.gguf", fixture("tiny-gqa4-bf16")},
           {np + "/tiny-gqa1.f16.gguf", tmp.file("f16dir")}}) {
    SCOPED_TRACE(file);
    auto g = load_gguf(file);
    auto d = Model::load(dir);
    ASSERT_TRUE(g.ok()) << g.status().to_string() << " (written by the gguf_np_fixtures ctest test)";
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ((*g)->config().head_dim, (*d)->config().head_dim);
    EXPECT_EQ(logits_of(**g), logits_of(**d));
  }
}

// Our model quantized in memory as `convert --weights q8|q4 --group-size 32` would (model/quantize.h).
std::vector<float> ours_quantized_logits(const Model& dense, WeightQuant format) {
  QuantizeOptions qo;
  qo.format = format;
  qo.group_size = 32;
  auto q = quantize_weights(dense.config(), dense.weights(), qo, &test::pool());
  EXPECT_TRUE(q.ok()) << q.status().to_string();
  if (!q.ok()) return {};
  return logits_of(*Model::from_weights(dense.config(), q->weights, q->storage));
}

// Stated bounds (README "GGUF"): our converter's Q8_0 / Q4_K / Q4_0 files, loaded as our q8 / q4, are at
// most 1.5x as far from the f32 logits as our own q8 / q4 (group 32) conversion of the same model (on this
// tiny random model: ~3 % and ~21 % of the largest |logit|, tiny random models being very sensitive);
// Q5_K and Q6_K (5.5 and 6.6 bits per weight, loaded as our q8 but keeping their own rounding) lie
// between our q8 and our q4: at most 0.8x and 0.5x our q4's error (measured: 0.67x, 0.38x).
TEST(GgufDream, OurQuantizedFilesStayWithinTheirBounds) {
  test::TempDir tmp("quant");
  const std::string dir = tmp.file("wide");
  test::write_dense_checkpoint(dir, test::wide_config(), 3);
  auto dense = Model::load(dir);
  ASSERT_TRUE(dense.ok()) << dense.status().to_string();
  const double q8 = relative_error(ours_quantized_logits(**dense, WeightQuant::kQ8), logits_of(**dense));
  const double q4 = relative_error(ours_quantized_logits(**dense, WeightQuant::kQ4), logits_of(**dense));
  struct Case {
    GgufWeights weights;
    double bound;
  };
  for (const Case& c : {Case{GgufWeights::kQ8_0, 1.5 * q8}, Case{GgufWeights::kQ4_K, 1.5 * q4},
                        Case{GgufWeights::kQ4_0, 1.5 * q4}, Case{GgufWeights::kQ5_K, 0.8 * q4},
                        Case{GgufWeights::kQ6_K, 0.5 * q4}}) {
    const Pair p = convert_and_compare(dir, tmp.file("q.gguf"), c.weights);
    ASSERT_FALSE(p.dir.empty());
    const double err = relative_error(p.gguf, p.dir);
    EXPECT_LE(err, c.bound) << "weights type " << static_cast<int>(c.weights) << ", our q8 " << q8 << ", q4 " << q4;
    EXPECT_GT(err, 0.0);  // it is quantized
  }
}

// A dream GGUF of wide_config() whose matrices are random blocks of `type` (scales set so values stay
// near ±1) and, as the reference, the same values dequantized into an F32 GGUF.
void write_random_block_files(GgufType type, const std::string& quant_path, const std::string& f32_path) {
  const ModelConfig c = test::wide_config();
  GgufWriter q, f;
  for (GgufWriter* w : {&q, &f}) {
    w->add_string("general.architecture", "dream");
    w->add_u32("dream.context_length", static_cast<uint32_t>(c.max_position_embeddings));
    w->add_u32("dream.embedding_length", static_cast<uint32_t>(c.n_embd));
    w->add_u32("dream.feed_forward_length", static_cast<uint32_t>(c.n_ff));
    w->add_u32("dream.block_count", static_cast<uint32_t>(c.n_layer));
    w->add_u32("dream.attention.head_count", static_cast<uint32_t>(c.n_head));
    w->add_u32("dream.attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
    w->add_f32("dream.rope.freq_base", 10000.0f);
    w->add_f32("dream.attention.layer_norm_rms_epsilon", 1e-6f);
    w->add_u32("tokenizer.ggml.mask_token_id", static_cast<uint32_t>(c.mask_token_id));
  }
  const GgufTypeInfo info = *gguf_type_info(static_cast<uint32_t>(type));
  // The f16 scale fields of a block and the value that keeps |x| ≲ 1.
  const uint16_t small = type == GgufType::kQ6_K ? f32_to_f16(2e-4f) : type == GgufType::kQ4_0 ? f32_to_f16(0.1f)
                         : type == GgufType::kQ8_0 ? f32_to_f16(0.008f) : f32_to_f16(5e-4f);
  static std::deque<std::vector<uint8_t>> keep;  // the producers run inside write(); a deque keeps addresses
  keep.clear();
  ModelWeights shapes;
  uint64_t seed = static_cast<uint64_t>(type) << 40;
  std::vector<std::tuple<std::string, std::vector<int64_t>, bool>> slots;
  visit_weights(c, shapes, [&](const WeightSlot& s) { slots.emplace_back(gguf_tensor_name(s.name), s.shape, s.matrix != nullptr); });
  for (const auto& [name, shape, matrix] : slots) {
    const int64_t rows = shape.size() > 1 ? shape[0] : 1, cols = shape.back();
    const std::vector<int64_t> dims(shape.rbegin(), shape.rend());
    std::vector<float> values(static_cast<size_t>(rows * cols));
    if (matrix) {
      std::vector<uint8_t>& blocks = keep.emplace_back(static_cast<size_t>(rows * cols / info.block * info.bytes));
      for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<uint8_t>(splitmix64(seed++) >> 56);
      for (size_t b = 0; b < blocks.size() / static_cast<size_t>(info.bytes); ++b) {
        uint8_t* blk = blocks.data() + b * static_cast<size_t>(info.bytes);
        const size_t d_at = type == GgufType::kQ6_K ? 208 : 0;
        std::memcpy(blk + d_at, &small, 2);
        if (type == GgufType::kQ4_K || type == GgufType::kQ5_K) std::memcpy(blk + 2, &small, 2);  // dmin
      }
      gguf_dequantize(type, blocks.data(), values.data(), rows * cols);
      const std::vector<uint8_t>* src = &blocks;
      q.add_tensor(name, type, dims, [src](const ByteSink& sink) { return sink(src->data(), src->size()); });
    } else {
      for (float& x : values) x = 1.0f + static_cast<float>(splitmix64(seed++) >> 40) / 167772160.0f;
    }
    std::vector<uint8_t>& bytes = keep.emplace_back(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    const std::vector<uint8_t>* fb = &bytes;
    auto dense = [fb](const ByteSink& sink) { return sink(fb->data(), fb->size()); };
    f.add_tensor(name, GgufType::kF32, dims, dense);
    if (!matrix) q.add_tensor(name, GgufType::kF32, dims, dense);
  }
  ASSERT_TRUE(q.write(quant_path).ok());
  ASSERT_TRUE(f.write(f32_path).ok());
}

// Q8_0, Q5_K and Q6_K are dequantized and re-quantized per row into our q8: the logits are exactly
// those of our q8 of the dequantized (F32) file. Q4_0 (repacked exactly) and Q4_K (scale products
// rounded to f16) become our q4: within 2 % of the F32 file's largest |logit| (the q4 kernel's own
// rounding of the activations remains).
TEST(GgufDream, EveryBlockTypeLoadsWithinItsBound) {
  test::TempDir tmp("blocks");
  for (GgufType type : {GgufType::kQ4_0, GgufType::kQ4_K, GgufType::kQ8_0, GgufType::kQ5_K, GgufType::kQ6_K}) {
    SCOPED_TRACE(gguf_type_info(static_cast<uint32_t>(type))->name);
    write_random_block_files(type, tmp.file("q.gguf"), tmp.file("f.gguf"));
    auto q = load_gguf(tmp.file("q.gguf"));
    auto f = load_gguf(tmp.file("f.gguf"));
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const bool q4 = type == GgufType::kQ4_0 || type == GgufType::kQ4_K;
    EXPECT_EQ((*q)->weights().layers[0].wq.quant, q4 ? WeightQuant::kQ4 : WeightQuant::kQ8);
    if (q4) {
      EXPECT_LE(relative_error(logits_of(**q), logits_of(**f)), 2e-2);
    } else {
      EXPECT_EQ(logits_of(**q), ours_quantized_logits(**f, WeightQuant::kQ8));
    }
  }
}
TEST(GgufDream, MissingTensorAndForeignMetadataAreNamed) {
  testing::load_manifest();
  test::TempDir tmp("bad");
  GgufConvertOptions o;
  o.model_dir = fixture("tiny-gqa1");
  o.out_path = tmp.file("ok.gguf");
  o.weights = GgufWeights::kF32;
  ASSERT_TRUE(convert_to_gguf(o, &test::pool()).ok());
  auto file = GgufFile::open(o.out_path);
  ASSERT_TRUE(file.ok());
  // Rename one tensor in place (same length) and the architecture: the loader names what is wrong.
  std::vector<uint8_t> bytes(std::filesystem::file_size(o.out_path));
  {
    std::ifstream in(o.out_path, std::ios::binary);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  auto replace = [](std::vector<uint8_t> b, const std::string& from, const std::string& to) {
    auto it = std::search(b.begin(), b.end(), from.begin(), from.end());
    EXPECT_NE(it, b.end());
    std::copy(to.begin(), to.end(), it);
    return b;
  };
  test::write_bytes(tmp.file("missing.gguf"), replace(bytes, "blk.1.ffn_up.weight", "blk.1.ffn_XX.weight"));
  auto m = load_gguf(tmp.file("missing.gguf"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor 'blk.1.ffn_up.weight' (our model.layers.1.mlp.up_proj.weight) is missing"),
            std::string::npos) << m.status().to_string();
  test::write_bytes(tmp.file("llama.gguf"), replace(bytes, "dream", "llama"));
  auto l = load_gguf(tmp.file("llama.gguf"));
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("general.architecture is 'llama'"), std::string::npos) << l.status().to_string();
  test::write_bytes(tmp.file("nomask.gguf"), replace(bytes, "tokenizer.ggml.mask_token_id", "tokenizer.ggml.mask_token_XX"));
  auto n = load_gguf(tmp.file("nomask.gguf"));
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("no mask token"), std::string::npos) << n.status().to_string();
}

TEST(GgufDream, ChatTemplateTravelsFromTokenizerConfig) {
  testing::load_manifest();
  test::TempDir tmp("chat");
  const std::string dir = tmp.file("m");
  std::filesystem::copy(fixture("tiny-gqa1"), dir, std::filesystem::copy_options::recursive);
  GgufConvertOptions o;
  o.model_dir = dir;
  o.out_path = tmp.file("plain.gguf");
  o.weights = GgufWeights::kF16;
  ASSERT_TRUE(convert_to_gguf(o, &test::pool()).ok());
  auto plain = GgufFile::open(o.out_path);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(gguf_chat_template(*plain).has_value());
  const std::string tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  ASSERT_TRUE(write_text_file(dir + "/tokenizer_config.json", nlohmann::json{{"chat_template", tmpl}}.dump()).ok());
  o.out_path = tmp.file("chat.gguf");
  ASSERT_TRUE(convert_to_gguf(o, &test::pool()).ok());
  auto chat = GgufFile::open(o.out_path);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(gguf_chat_template(*chat), tmpl);
  EXPECT_EQ(*chat->get_int("general.file_type"), 1);  // MOSTLY_F16
  EXPECT_EQ(chat->find("dream.attention.causal")->i, 0);
}

TEST(GgufDream, TensorNames) {
  EXPECT_EQ(gguf_tensor_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.12.self_attn.k_proj.bias"), "blk.12.attn_k.bias");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.post_attention_layernorm.weight"), "blk.0.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.rotary.inv_freq"), "");
  EXPECT_TRUE(is_gguf_path("/m/DiffuCoder-7B-Q4_K_M.gguf"));
  EXPECT_FALSE(is_gguf_path("/m/DiffuCoder-7B"));
}

}  // namespace
}  // namespace dc
