// Dream GGUF files against the safetensors checkpoints they come from: our converter's F32 / BF16 / F16
// files give identical logits, the quantized ones (ours, of every type; hand-made random blocks of every ggml
// block type, run in place) stay within stated bounds; missing tensors and foreign metadata give clear errors.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include "../fixtures.h"
#include "core/dtype.h"
#include "engine/engine.h"
#include "gguf/quants.h"
#include "gguf/tokenizer_gguf.h"
#include "gguf/writer.h"
#include "gguf_model_util.h"
#include "gguf_test_util.h"
#include "io/checkpoint.h"
#include "model/quantize.h"
#include "ops/cpu/quant.h"

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

// A GGUF file of `path` generates through the Engine: 8 tokens in 4 steps from a fixed prompt of ids, every
// position unmasked to an id of the vocabulary.
void expect_generates(const std::string& path) {
  EngineOptions o;
  o.model_dir = path;
  o.n_threads = 2;
  o.weight_cache = "off";
  auto engine = Engine::load(o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  SamplingParams p = (*engine)->default_params();  // the file's mask and stop ids
  p.max_new_tokens = 8;
  p.steps = 4;
  p.seed = 7;
  auto out = (*engine)->generate({{5, 17, 42, 99}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->generated.size(), 1u);
  ASSERT_EQ(out->generated[0].size(), 8u);
  const ModelConfig& c = (*engine)->config();
  for (int32_t id : out->generated[0]) {
    EXPECT_NE(id, c.mask_token_id);
    EXPECT_TRUE(id >= 0 && id < c.n_vocab) << id;
  }
}

// Stated bounds (docs/quantization.md): our converter's files against the f32 logits, in units of our own q8 /
// q4 (group 32) conversion's error of the same model (on this tiny random model ~3 % and ~21 % of the
// largest |logit|, tiny random models being very sensitive): Q8_0, Q4_K and Q4_0 at most 1.5x our q8 / q4;
// Q5_K and Q6_K (5.5 and 6.6 bits per weight) between our q8 and our q4, at most 0.8x and 0.5x our q4's
// error (measured: 0.70x, 0.33x); Q4_1 (5 bits, our q4's own layout) at most 1.5x, Q5_0 / Q5_1 (5.5 / 6 bits)
// 0.8x our q4 (measured: 1.08x, 0.62x, 0.62x); the 3- and 2-bit K-quants Q3_K (3.4 bits) and Q2_K (2.6 bits)
// at most 3.5x and 6.5x our q4 (measured: 2.4x and 4.7x: a 2-bit code's step is 5x a 4-bit one's, a 3-bit
// code's 2x), Q2_K further than Q3_K, and Q3_K further than Q4_K; each of those five files loads and generates.
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
    bool generate;
  };
  std::map<GgufWeights, double> errors;
  for (const Case& c : {Case{GgufWeights::kQ8_0, 1.5 * q8, false}, Case{GgufWeights::kQ4_K, 1.5 * q4, false},
                        Case{GgufWeights::kQ4_0, 1.5 * q4, false}, Case{GgufWeights::kQ5_K, 0.8 * q4, false},
                        Case{GgufWeights::kQ6_K, 0.5 * q4, false}, Case{GgufWeights::kQ4_1, 1.5 * q4, true},
                        Case{GgufWeights::kQ5_0, 0.8 * q4, true}, Case{GgufWeights::kQ5_1, 0.8 * q4, true},
                        Case{GgufWeights::kQ3_K, 3.5 * q4, true}, Case{GgufWeights::kQ2_K, 6.5 * q4, true}}) {
    const Pair p = convert_and_compare(dir, tmp.file("q.gguf"), c.weights);
    ASSERT_FALSE(p.dir.empty());
    const double err = relative_error(p.gguf, p.dir);
    EXPECT_LE(err, c.bound) << "weights type " << static_cast<int>(c.weights) << ", our q8 " << q8 << ", q4 " << q4;
    EXPECT_GT(err, 0.0);  // it is quantized
    if (c.generate) expect_generates(tmp.file("q.gguf"));
    errors[c.weights] = err;
  }
  EXPECT_GT(errors[GgufWeights::kQ2_K], errors[GgufWeights::kQ3_K]);
  EXPECT_GT(errors[GgufWeights::kQ3_K], errors[GgufWeights::kQ4_K]);
}

// The converter's fallback where a matrix's columns do not fill the type's block, for every quantized type:
// with 96 / 160 columns (multiples of 32, not of 256) the K-quants write Q8_0 and the 32-value types
// themselves; with 48 / 80 columns every type writes F16. general.file_type is llama.cpp's for the type.
TEST(GgufDream, ConverterFallsBackWhereColumnsDoNotFillABlock) {
  test::TempDir tmp("fallback");
  struct Type {
    GgufWeights weights;
    GgufType type;
    int64_t file_type;
  };
  const Type types[] = {{GgufWeights::kQ8_0, GgufType::kQ8_0, 7},  {GgufWeights::kQ4_0, GgufType::kQ4_0, 2},
                        {GgufWeights::kQ4_1, GgufType::kQ4_1, 3},  {GgufWeights::kQ5_0, GgufType::kQ5_0, 8},
                        {GgufWeights::kQ5_1, GgufType::kQ5_1, 9},  {GgufWeights::kQ2_K, GgufType::kQ2_K, 10},
                        {GgufWeights::kQ3_K, GgufType::kQ3_K, 11}, {GgufWeights::kQ4_K, GgufType::kQ4_K, 14},
                        {GgufWeights::kQ5_K, GgufType::kQ5_K, 16}, {GgufWeights::kQ6_K, GgufType::kQ6_K, 18}};
  for (const int64_t n_embd : {96, 48}) {
    ModelConfig c = test::wide_config();
    c.n_embd = n_embd, c.head_dim = n_embd / c.n_head, c.n_ff = n_embd * 5 / 3;  // 160 / 80
    const std::string dir = tmp.file("m" + std::to_string(n_embd));
    test::write_dense_checkpoint(dir, c, 4);
    for (const Type& t : types) {
      SCOPED_TRACE(std::string(gguf_type_info(static_cast<uint32_t>(t.type))->name) + ", n_embd " + std::to_string(n_embd));
      GgufConvertOptions o;
      o.model_dir = dir;
      o.out_path = tmp.file("f.gguf");
      o.weights = t.weights;
      ASSERT_TRUE(convert_to_gguf(o, &test::pool()).ok());
      auto f = GgufFile::open(o.out_path);
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      EXPECT_EQ(*f->get_int("general.file_type"), t.file_type);
      const bool k_quant = gguf_type_info(static_cast<uint32_t>(t.type))->block == 256;
      const GgufType want = n_embd % 32 != 0 ? GgufType::kF16 : k_quant ? GgufType::kQ8_0 : t.type;
      for (const GgufTensor& tensor : f->tensors())
        EXPECT_EQ(tensor.type, tensor.dims.size() == 2 ? want : GgufType::kF32) << tensor.name;
    }
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
  // The f16 scale fields of a block (byte offset, value) that keep the values |x| ≲ 1.
  std::vector<std::pair<size_t, float>> fields;
  switch (type) {
    case GgufType::kQ4_0: fields = {{0, 0.1f}}; break;
    case GgufType::kQ4_1: fields = {{0, 0.01f}, {2, -0.08f}}; break;
    case GgufType::kQ5_0: fields = {{0, 0.05f}}; break;
    case GgufType::kQ5_1: fields = {{0, 0.005f}, {2, -0.08f}}; break;
    case GgufType::kQ8_0: fields = {{0, 0.008f}}; break;
    case GgufType::kQ2_K: fields = {{80, 0.01f}, {82, 0.01f}}; break;
    case GgufType::kQ3_K: fields = {{108, 0.005f}}; break;
    case GgufType::kQ4_K: case GgufType::kQ5_K: fields = {{0, 5e-4f}, {2, 5e-4f}}; break;
    case GgufType::kQ6_K: fields = {{208, 2e-4f}}; break;
    default: FAIL() << "not a block type";
  }
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
        for (const auto& [at, value] : fields) {
          const uint16_t h = f32_to_f16(value);
          std::memcpy(blk + at, &h, 2);
        }
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

// Every block type loads as itself (WeightQuant::kGguf over the file's own bytes, nothing re-quantized)
// and runs: with the reference kernels (each row dequantized exactly as ggml does, dot products in double)
// the logits are the F32 file's (of the same values dequantized) up to f32 summation order; the fast
// kernel rounds the activations to int8 per 16 columns (each within 1/254 of its group's largest |x|;
// its per-product bound is tests/ops/gguf_matmul_test.cc's), and so stays closer to the F32 file's logits
// than our own q8 of the same values, which rounds the weights too and the activations per 128 columns.
// (Measured on these chaotic random models, fast / our q8: Q4_0 0.0040 / 0.0066, Q8_0 0.080 / 0.106,
// Q6_K 0.0835 / 0.0848, Q4_K 0.0005 / 0.0020 of the largest |logit|.)
TEST(GgufDream, EveryBlockTypeRunsAsItIs) {
  // Summation order alone, amplified by these chaotic models: up to 1.5e-5 measured (Q3_K, the -O1 ASan
  // build); 1e-4 is still 5x below the closest the fast kernel's activation rounding comes (Q4_K's 0.0005).
  constexpr double kOrderOnly = 1e-4;
  test::TempDir tmp("blocks");
  for (GgufType type : {GgufType::kQ4_0, GgufType::kQ4_1, GgufType::kQ5_0, GgufType::kQ5_1, GgufType::kQ8_0,
                        GgufType::kQ2_K, GgufType::kQ3_K, GgufType::kQ4_K, GgufType::kQ5_K, GgufType::kQ6_K}) {
    SCOPED_TRACE(gguf_type_info(static_cast<uint32_t>(type))->name);
    write_random_block_files(type, tmp.file("q.gguf"), tmp.file("f.gguf"));
    auto q = load_gguf(tmp.file("q.gguf"));
    auto f = load_gguf(tmp.file("f.gguf"));
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const WeightView& wq = (*q)->weights().layers[0].wq;
    EXPECT_EQ(wq.quant, WeightQuant::kGguf);
    EXPECT_EQ(static_cast<uint32_t>(wq.ggml_type), static_cast<uint32_t>(type));
    const std::vector<float> want = logits_of(**f, /*reference_kernels=*/true);
    EXPECT_LE(relative_error(logits_of(**q, /*reference_kernels=*/true), want), kOrderOnly);
    const double fast = relative_error(logits_of(**q), want);
    if (!cpu::cpu_has_avx512_vnni()) {  // the portable kernel: the dequantized rows in f32
      EXPECT_LE(fast, kOrderOnly);
      continue;
    }
    const double ours_q8 = relative_error(ours_quantized_logits(**f, WeightQuant::kQ8), want);
    EXPECT_LE(fast, ours_q8) << "fast " << fast << ", our q8 " << ours_q8;
    EXPECT_GT(fast, 0.0);  // the activations were rounded: the fast kernel ran
  }
}

// The loaded matrices are the file's bytes: a kGguf view points into the mapping, so the model takes
// about the file's size (the old loader copied Q8_0 into our q8, 1.9x the file's Q4_K-sized blocks...).
TEST(GgufDream, BlockWeightsPointIntoTheFile) {
  test::TempDir tmp("inplace");
  write_random_block_files(GgufType::kQ4_K, tmp.file("q.gguf"), tmp.file("f.gguf"));
  auto g = load_gguf_model(tmp.file("q.gguf"), &test::pool());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const GgufTensor* t = g->file->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(g->weights.layers[0].wq.data, static_cast<const void*>(t->data));
  EXPECT_EQ(g->weights.layers[0].wq.ggml_type, cpu::GgmlType::kQ4_K);
}

// A block with a non-finite scale is refused at load, naming the tensor and the row.
TEST(GgufDream, NonFiniteBlockScaleIsRefused) {
  test::TempDir tmp("nonfinite");
  write_random_block_files(GgufType::kQ3_K, tmp.file("q.gguf"), tmp.file("f.gguf"));
  std::vector<char> bytes;
  {
    std::ifstream in(tmp.file("q.gguf"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto parsed = parse_gguf(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "q.gguf");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  const GgufTensor& t = parsed->tensors[parsed->by_name.at("blk.1.ffn_down.weight")];
  const size_t at = parsed->data_offset + t.offset + 3 * (t.n_bytes / static_cast<size_t>(t.dims[1])) + 108;
  bytes[at] = 0x00;
  bytes[at + 1] = 0x7C;  // d = +inf in row 3's first block
  {
    std::ofstream out(tmp.file("bad.gguf"), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto g = load_gguf(tmp.file("bad.gguf"));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("blk.1.ffn_down.weight' row 3"), std::string::npos) << g.status().to_string();
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
