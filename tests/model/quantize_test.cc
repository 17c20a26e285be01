// q8 / q4 weights end to end: the round-trip error bounds of the quantizers, the config block, convert
// on every tiny fixture then load and forward (logits against the unquantized model), the loader's
// checks of quantized tensors, and convert's errors. The logit error on a random model of the Qwen2.5-0.5B
// shape is bench/kernels/quantized_model_bench.cc (docs/bench.md).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "batch_case.h"
#include "fixtures.h"
#include "io/config_json.h"
#include "io/safetensors.h"
#include "model/convert.h"
#include "model/quantize.h"
#include "model/transformer.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return dc::testing::fixtures_dir() + "/" + name; }

// ---- quantizers --------------------------------------------------------------------------------------

std::vector<float> awkward_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::pow(10.0f, static_cast<float>(r % 7) - 4.0f);  // 1e-4 .. 1e2
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = scale * dist(gen);
  }
  for (int64_t c = 0; c < cols; ++c) w[1 * cols + c] = 0.0f;           // a row of zeros
  for (int64_t c = 0; c < cols; ++c) w[2 * cols + c] = 0.3f;           // a constant row (not an f16 value)
  for (int64_t c = 0; c < cols; c += 2) w[3 * cols + c] = -17.25f;     // two values only
  w[4 * cols + 5] = 1000.0f;                                            // an outlier
  return w;
}

TEST(Quantize, Q8ErrorIsAtMostHalfTheRowScale) {
  const int64_t rows = 12, cols = 100;
  const auto w = awkward_matrix(rows, cols, 1);
  ThreadPool pool(2);
  auto q = quantize_matrix(WeightView{DType::kF32, w.data(), rows, cols}, {WeightQuant::kQ8}, "w", &pool);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->view.dtype, DType::kI8);
  std::vector<float> back(cols);
  for (int64_t r = 0; r < rows; ++r) {
    q->view.row_to_f32(r, back.data());
    const float s = q->scales_f32[r];
    for (int64_t c = 0; c < cols; ++c) {
      const int8_t code = static_cast<int8_t>(q->codes[r * cols + c]);
      ASSERT_GE(code, -127) << "row " << r;
      ASSERT_LE(std::abs(w[r * cols + c] - back[c]), s / 2 * (1 + 1e-6f)) << "row " << r << " col " << c;
    }
  }
}

TEST(Quantize, Q4ErrorIsAtMostHalfTheGroupScale) {
  const int64_t rows = 12, cols = 128;
  const auto w = awkward_matrix(rows, cols, 2);
  ThreadPool pool(2);
  for (int64_t group : {32, 64, 128}) {
    QuantizeOptions o{WeightQuant::kQ4, group};
    auto q = quantize_matrix(WeightView{DType::kF32, w.data(), rows, cols}, o, "w", &pool);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    std::vector<float> back(cols);
    for (int64_t r = 0; r < rows; ++r) {
      q->view.row_to_f32(r, back.data());
      for (int64_t c = 0; c < cols; ++c) {
        const float s = f16_to_f32(q->scales_f16[r * (cols / group) + c / group]);
        const float mn = f16_to_f32(q->mins_f16[r * (cols / group) + c / group]);
        ASSERT_GE(s, 0.0f);
        ASSERT_LE(std::abs(w[r * cols + c] - back[c]), s / 2 * (1 + 1e-5f) + 1e-6f * std::abs(mn))
            << "group " << group << " row " << r << " col " << c << " scale " << s;
      }
    }
    // The row of zeros and the representable row come back exactly.
    q->view.row_to_f32(1, back.data());
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(back[c], 0.0f);
  }
}

// RMS error relative to the RMS weight over a Gaussian matrix (what README.md reports).
double relative_rms_error(const std::vector<float>& w, const QuantizedMatrix& q) {
  std::vector<float> back(q.view.cols);
  double e2 = 0, w2 = 0;
  for (int64_t r = 0; r < q.view.rows; ++r) {
    q.view.row_to_f32(r, back.data());
    for (int64_t c = 0; c < q.view.cols; ++c) {
      const double d = w[r * q.view.cols + c] - back[c];
      e2 += d * d;
      w2 += static_cast<double>(w[r * q.view.cols + c]) * w[r * q.view.cols + c];
    }
  }
  return std::sqrt(e2 / w2);
}

TEST(Quantize, Q4WithMinIsMoreAccurateThanSymmetric) {
  const int64_t rows = 256, cols = 1024;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::student_t_distribution<float> heavy(3.0f);
  ThreadPool pool(2);
  for (bool heavy_tailed : {false, true}) {
    std::vector<float> w(rows * cols);
    for (auto& v : w) v = heavy_tailed ? 0.02f * heavy(gen) : normal(gen);
    const WeightView dense{DType::kF32, w.data(), rows, cols};
    auto q8 = quantize_matrix(dense, {WeightQuant::kQ8}, "w", &pool);
    auto with_min = quantize_matrix(dense, {WeightQuant::kQ4, 32, true, Q4Variant::kMin}, "w", &pool);
    auto symmetric = quantize_matrix(dense, {WeightQuant::kQ4, 32, true, Q4Variant::kSymmetric}, "w", &pool);
    ASSERT_TRUE(q8.ok() && with_min.ok() && symmetric.ok());
    const double e8 = relative_rms_error(w, *q8), e_min = relative_rms_error(w, *with_min),
                 e_sym = relative_rms_error(w, *symmetric);
    std::printf("  %s weights: relative RMS error q8 %.4f, q4 with min %.4f, q4 symmetric %.4f\n",
                heavy_tailed ? "Student-t(3)" : "Gaussian", e8, e_min, e_sym);
    EXPECT_LT(e_min, e_sym);
    EXPECT_LT(e8, e_min);
  }
}

TEST(Quantize, BadInputNamesTheTensor) {
  std::vector<float> w(4 * 64, 1.0f);
  w[2 * 64 + 3] = NAN;
  ThreadPool pool(1);
  auto q = quantize_matrix(WeightView{DType::kF32, w.data(), 4, 64}, {WeightQuant::kQ8}, "my.weight", &pool);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("my.weight"), std::string::npos) << q.status().message();
  EXPECT_NE(q.status().message().find("row 2"), std::string::npos) << q.status().message();
  q = quantize_matrix(WeightView{DType::kF32, w.data(), 4, 64}, {WeightQuant::kQ4, 32}, "my.weight", &pool);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("row 2"), std::string::npos) << q.status().message();
  w[2 * 64 + 3] = 1e6f;
  q = quantize_matrix(WeightView{DType::kF32, w.data(), 4, 64}, {WeightQuant::kQ4, 32}, "my.weight", &pool);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("f16"), std::string::npos) << q.status().message();
  q = quantize_matrix(WeightView{DType::kF32, w.data(), 2, 96}, {WeightQuant::kQ4, 64}, "odd.weight", &pool);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("odd.weight"), std::string::npos) << q.status().message();
  EXPECT_FALSE(check_quantize_options({WeightQuant::kQ4, 48}).ok());
  EXPECT_FALSE(check_quantize_options({WeightQuant::kNone}).ok());
}

TEST(Quantize, ConfigBlock) {
  auto q = parse_quantization_config(R"({"hidden_size": 8})", "c.json");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format, WeightQuant::kNone);
  q = parse_quantization_config(R"({"quantization": {"format": "q4", "group_size": 64}})", "c.json");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format, WeightQuant::kQ4);
  EXPECT_EQ(q->group_size, 64);
  q = parse_quantization_config(R"({"quantization": {"format": "q8", "group_size": 0}})", "c.json");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format, WeightQuant::kQ8);
  for (const char* bad : {R"({"quantization": {"format": "q3"}})", R"({"quantization": {"format": "q4"}})",
                          R"({"quantization": {"format": "q4", "group_size": 7}})", R"({"quantization": 4})",
                          R"({"quantization": {"format": "q8", "group_size": 32}})"}) {
    q = parse_quantization_config(bad, "c.json");
    ASSERT_FALSE(q.ok()) << bad;
    EXPECT_NE(q.status().message().find("c.json"), std::string::npos) << q.status().message();
  }
}

// ---- convert + load + forward ------------------------------------------------------------------------

std::vector<BatchCase> fixture_cases(const std::string& dir) {
  std::vector<BatchCase> cases;
  const auto forward = dc::testing::load_json(dir + "/reference/forward.json");
  for (const auto& c : forward["cases"]) cases.push_back(forward_fixture_case(c));
  return cases;
}

std::vector<float> logits_of(const Model& model, const BatchCase& k, const Context& ctx) {
  std::vector<float> out(k.rows.size() * model.config().n_vocab);
  const Status s = model.forward(ctx, k.view(), out.data());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double d2 = 0, w2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w2 += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(d2 / w2);
}

Status convert(const std::string& model, const fs::path& out, WeightQuant format, int64_t group = 32,
               size_t shard_bytes = size_t{2} << 30, bool force = false) {
  ConvertOptions o;
  o.model_dir = model;
  o.out_dir = out.string();
  o.quantize.format = format;
  o.quantize.group_size = group;
  o.force = force;
  o.shard_bytes = shard_bytes;
  ThreadPool pool(2);
  return convert_checkpoint(o, &pool);
}

bool has_tmp_leftover(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

TEST(QuantizedCheckpoint, ConvertLoadAndForwardEveryFixture) {
  const auto manifest = dc::testing::load_manifest();
  const test::TempDir tmp("quant_fixtures");
  const fs::path dir = tmp.path();
  ThreadPool pool(2);
  const Context ctx{Device::kCpu, &pool};
  int n = 0, n_cases = 0;
  for (const auto& m : manifest["models"]) {
    const std::string name = m["name"].get<std::string>(), src = fixture(m["dir"].get<std::string>());
    auto dense = Model::load(src);
    ASSERT_TRUE(dense.ok()) << dense.status().to_string();
    const auto cases = fixture_cases(src);
    for (WeightQuant format : {WeightQuant::kQ8, WeightQuant::kQ4}) {
      const fs::path out = dir / (name + "-" + quant_format_name(format));
      const Status s = convert(src, out, format);
      ASSERT_TRUE(s.ok()) << name << ": " << s.to_string();
      EXPECT_FALSE(has_tmp_leftover(dir)) << "temporary directory left behind in " << dir;
      auto q = Model::load(out.string());
      ASSERT_TRUE(q.ok()) << name << ": " << q.status().to_string();
      EXPECT_EQ((*q)->weights().layers[0].wq.quant, format);
      EXPECT_EQ((*q)->weights().tok_embd.quant, format);
      EXPECT_TRUE(fs::exists(out / "generation_config.json") == fs::exists(fs::path(src) / "generation_config.json"));
      double worst = 0;
      for (const BatchCase& k : cases) {
        ++n_cases;
        const auto want = logits_of(**dense, k, ctx), got = logits_of(**q, k, ctx);
        for (float v : got) ASSERT_TRUE(std::isfinite(v));
        worst = std::max(worst, relative_error(got, want));
      }
      std::printf("  %-16s %s: relative logit error vs unquantized %.2e\n", name.c_str(), quant_format_name(format),
                  worst);
      EXPECT_LT(worst, format == WeightQuant::kQ8 ? 0.03 : 0.25) << name;
      ++n;
    }
  }
  EXPECT_GE(n, 8);
  EXPECT_GE(n_cases, 8 * 4);
}

TEST(QuantizedCheckpoint, ShardsInMemoryAndFileAgree) {
  const std::string src = fixture("tiny-gqa2");
  const test::TempDir tmp("quant_shards");
  const fs::path dir = tmp.path();
  ASSERT_TRUE(convert(src, dir / "one", WeightQuant::kQ4).ok());
  ASSERT_TRUE(convert(src, dir / "many", WeightQuant::kQ4, 32, 20000).ok());
  EXPECT_TRUE(fs::exists(dir / "many" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "many" / "model.safetensors"));
  auto one = Model::load((dir / "one").string()), many = Model::load((dir / "many").string());
  ASSERT_TRUE(one.ok() && many.ok()) << many.status().to_string();
  EXPECT_GT((*many)->checkpoint()->files().size(), 2u);
  auto dense = Model::load(src);
  ASSERT_TRUE(dense.ok());
  ThreadPool pool(2);
  auto in_memory = quantize_weights((*dense)->config(), (*dense)->weights(), {WeightQuant::kQ4, 32}, &pool);
  ASSERT_TRUE(in_memory.ok());
  auto mem = Model::from_weights((*dense)->config(), in_memory->weights, in_memory->storage);
  const Context ctx{Device::kCpu, &pool};
  for (const BatchCase& k : fixture_cases(src)) {
    const auto a = logits_of(**one, k, ctx);
    EXPECT_EQ(a, logits_of(**many, k, ctx));
    EXPECT_EQ(a, logits_of(*mem, k, ctx));
  }
}

TEST(QuantizedCheckpoint, FastKernelsMatchReferenceKernels) {
  const std::string src = fixture("tiny-gqa2");
  const test::TempDir tmp("quant_kernels");
  const fs::path dir = tmp.path();
  ThreadPool pool(3);
  for (WeightQuant format : {WeightQuant::kQ8, WeightQuant::kQ4}) {
    ASSERT_TRUE(convert(src, dir / quant_format_name(format), format).ok());
    auto q = Model::load((dir / quant_format_name(format)).string());
    ASSERT_TRUE(q.ok());
    Context fast{Device::kCpu, &pool}, ref{Device::kCpu, &pool};
    ref.reference_kernels = true;
    for (const BatchCase& k : fixture_cases(src)) {
      const double e = relative_error(logits_of(**q, k, fast), logits_of(**q, k, ref));
      EXPECT_LT(e, 2e-2) << quant_format_name(format);  // the int8 rounding of the activations
    }
  }
}

void rewrite_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto j = dc::testing::load_json((dir / "config.json").string());
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

void expect_load_error(const fs::path& dir, const std::vector<std::string>& parts) {
  auto m = Model::load(dir.string());
  ASSERT_FALSE(m.ok()) << dir;
  for (const auto& p : parts) EXPECT_NE(m.status().message().find(p), std::string::npos) << m.status().message();
}

TEST(QuantizedCheckpoint, LoaderChecksTensorsAgainstTheBlock) {
  const std::string src = fixture("tiny-gqa1");
  const test::TempDir tmp("quant_loader");
  const fs::path dir = tmp.path();
  ASSERT_TRUE(convert(src, dir / "q4", WeightQuant::kQ4).ok());
  ASSERT_TRUE(convert(src, dir / "q8", WeightQuant::kQ8).ok());
  // The block says q8 but the tensors are q4.
  fs::copy(dir / "q4", dir / "says_q8", fs::copy_options::recursive);
  rewrite_config(dir / "says_q8", [](nlohmann::json& j) { j["quantization"] = {{"format", "q8"}, {"group_size", 0}}; });
  expect_load_error(dir / "says_q8", {"model.embed_tokens.weight", "U8", "I8"});
  // The block's group size disagrees with the scales.
  fs::copy(dir / "q4", dir / "group16", fs::copy_options::recursive);
  rewrite_config(dir / "group16", [](nlohmann::json& j) { j["quantization"]["group_size"] = 16; });
  expect_load_error(dir / "group16", {".scale", "group_size 16"});
  // No block at all.
  fs::copy(dir / "q8", dir / "no_block", fs::copy_options::recursive);
  rewrite_config(dir / "no_block", [](nlohmann::json& j) { j.erase("quantization"); });
  expect_load_error(dir / "no_block", {".scale", "quantization"});
  // A q4 min missing.
  {
    fs::create_directories(dir / "no_min");
    auto file = SafetensorsFile::open((dir / "q4" / "model.safetensors").string());
    ASSERT_TRUE(file.ok());
    std::vector<TensorToWrite> keep;
    for (const auto& [name, t] : file->tensors())
      if (name != "model.layers.1.mlp.up_proj.weight.min") keep.push_back({name, t.dtype, t.shape, t.data});
    ASSERT_TRUE(write_safetensors((dir / "no_min" / "model.safetensors").string(), keep).ok());
    fs::copy_file(dir / "q4" / "config.json", dir / "no_min" / "config.json");
  }
  expect_load_error(dir / "no_min", {"model.layers.1.mlp.up_proj.weight.min", "missing"});
}

TEST(QuantizedCheckpoint, ConvertErrors) {
  const std::string src = fixture("tiny-gqa1");
  const test::TempDir tmp("quant_errors");
  const fs::path dir = tmp.path();
  auto expect_error = [](const Status& s, const std::string& part) {
    ASSERT_FALSE(s.ok()) << part;
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  };
  expect_error(convert("/nonexistent/model", dir / "a", WeightQuant::kQ8), "/nonexistent/model");
  EXPECT_FALSE(fs::exists(dir / "a"));
  EXPECT_FALSE(has_tmp_leftover(dir));
  expect_error(convert(src, dir / "a", WeightQuant::kNone), "q8 or q4");
  expect_error(convert(src, dir / "a", WeightQuant::kQ4, 20), "--group-size");
  ASSERT_TRUE(convert(src, dir / "a", WeightQuant::kQ8).ok());
  expect_error(convert(src, dir / "a", WeightQuant::kQ4), "--force");
  {  // --force replaces it
    ASSERT_TRUE(convert(src, dir / "a", WeightQuant::kQ4, 32, size_t{2} << 30, true).ok());
    auto config = load_model_config((dir / "a" / "config.json").string());
    ASSERT_TRUE(config.ok());
    EXPECT_EQ(config->quantization.format, WeightQuant::kQ4);
    EXPECT_FALSE(has_tmp_leftover(dir));
    for (const auto& e : fs::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".old."), std::string::npos) << e.path();
  }
  expect_error(convert((dir / "a").string(), dir / "b", WeightQuant::kQ8), "already quantized");
  // A checkpoint whose tensors disagree with config.json.
  fs::copy(src, dir / "wrong", fs::copy_options::recursive);
  rewrite_config(dir / "wrong", [](nlohmann::json& j) { j["intermediate_size"] = j["intermediate_size"].get<int>() + 1; });
  expect_error(convert((dir / "wrong").string(), dir / "c", WeightQuant::kQ8), "mlp.gate_proj.weight");
  EXPECT_FALSE(fs::exists(dir / "c"));
  EXPECT_FALSE(has_tmp_leftover(dir));
}

}  // namespace
}  // namespace dc
