// The engine's defaults (matmul precision from the checkpoint) and the packed-weight cache: written
// after a fresh pack, mapped on the next start with identical logits, and rebuilt (never used) when stale
// or damaged.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "batch_case.h"
#include "engine/engine.h"
#include "engine_fixtures.h"
#include "fixtures.h"
#include "model/convert.h"
#include "model/weight_cache.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/quant.h"
#include "temp_dir.h"

namespace dc {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return dc::testing::fixtures_dir() + "/" + name; }

// A private copy of a fixture checkpoint in a temporary directory (the tests write caches into it and touch
// its files).
test::TempDir copy_fixture(const std::string& name, const std::string& tag) {
  test::TempDir dir("wcache_" + tag);
  fs::copy(fixture(name), dir.path(), fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (is_weight_cache_file_name(e.path().filename().string())) fs::remove(e.path());
  return dir;
}

std::unique_ptr<Engine> load(const std::string& dir, std::optional<MatmulPrecision> precision,
                             const std::string& cache = "") {
  auto e = testing::load_engine(dir, 2, precision, cache);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(*e) : nullptr;
}

// Logits of every position of a fixed 2 × 7 batch.
std::vector<float> logits_of(Engine& e) {
  const int64_t B = 2, L = 7, V = e.config().n_vocab;
  const BatchCase k = every_position(B, L, [&](int64_t i) { return (i * 37 + 5) % std::min<int64_t>(V, 200); });
  std::vector<float> out(static_cast<size_t>(B * L * V));
  const Status s = e.logits_fn()(k.view(), out.data());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

void set_mtime(const fs::path& p, int64_t sec) {
  const struct timespec times[2] = {{sec, 0}, {sec, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, 0), 0) << p;
}

TEST(EngineDefaults, PrecisionFollowsTheCheckpoint) {
  auto bf16 = load(fixture("tiny-gqa4-bf16"), std::nullopt, "off");
  auto f32 = load(fixture("tiny-gqa1"), std::nullopt, "off");
  auto exact = load(fixture("tiny-gqa4-bf16"), MatmulPrecision::kF32, "off");
  ASSERT_TRUE(bf16 && f32 && exact);
  EXPECT_EQ(bf16->matmul_precision(), MatmulPrecision::kBF16);
  EXPECT_EQ(f32->matmul_precision(), MatmulPrecision::kF32);
  EXPECT_EQ(exact->matmul_precision(), MatmulPrecision::kF32);
  EXPECT_EQ(checkpoint_precision(bf16->model()), MatmulPrecision::kBF16);
  EXPECT_EQ(bf16->weight_cache_report().outcome, WeightCacheReport::kNotUsed);  // "off"
}

class WeightCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::cpu_has_avx512_bf16()) GTEST_SKIP() << "no AVX512_BF16: bf16 weights are not packed on this CPU";
  }
};

TEST_F(WeightCache, WrittenThenMappedWithIdenticalLogits) {
  const test::TempDir tmp = copy_fixture("tiny-gqa4-bf16", "roundtrip");
  const fs::path dir = tmp.path();
  const fs::path file = dir / "diffucoder-packed.bf16.bin";
  std::vector<float> fresh;
  {
    auto e = load(dir, std::nullopt);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->weight_cache_report().outcome, WeightCacheReport::kWriting);
    EXPECT_EQ(e->weight_cache_report().path, file.string());
    EXPECT_GT(e->weight_cache_report().bytes, 0);
    fresh = logits_of(*e);
  }  // the engine waits for the writer
  ASSERT_TRUE(fs::exists(file));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
  auto warm = load(dir, std::nullopt);
  ASSERT_TRUE(warm);
  EXPECT_EQ(warm->weight_cache_report().outcome, WeightCacheReport::kLoaded) << warm->weight_cache_report().note;
  EXPECT_EQ(logits_of(*warm), fresh);  // bit for bit
  auto uncached = load(dir, std::nullopt, "off");
  EXPECT_EQ(logits_of(*uncached), fresh);
  // The exact path packs nothing for bf16 weights: no cache of its own.
  auto exact = load(dir, MatmulPrecision::kF32);
  EXPECT_EQ(exact->weight_cache_report().outcome, WeightCacheReport::kNotUsed);
  EXPECT_FALSE(fs::exists(dir / "diffucoder-packed.f32.bin"));
}

TEST_F(WeightCache, StaleWhenTheCheckpointChanged) {
  const test::TempDir tmp = copy_fixture("tiny-gqa4-bf16", "stale");
  const fs::path dir = tmp.path();
  std::vector<float> fresh;
  {
    auto e = load(dir, std::nullopt);
    fresh = logits_of(*e);
  }
  // A safetensors file rewritten since (same size, new mtime), then config.json.
  for (const char* name : {"model.safetensors", "config.json"}) {
    fs::path victim = dir / name;
    if (!fs::exists(victim)) victim = *fs::directory_iterator(dir);  // sharded fixture: any shard
    set_mtime(victim, 1000000000);
    auto e = load(dir, std::nullopt);
    EXPECT_EQ(e->weight_cache_report().outcome, WeightCacheReport::kWriting) << name;
    EXPECT_NE(e->weight_cache_report().note.find("stale"), std::string::npos) << e->weight_cache_report().note;
    EXPECT_EQ(logits_of(*e), fresh);
    e.reset();
    auto again = load(dir, std::nullopt);  // rebuilt: used again
    EXPECT_EQ(again->weight_cache_report().outcome, WeightCacheReport::kLoaded) << again->weight_cache_report().note;
  }
}

TEST_F(WeightCache, DamagedCacheIsDetectedAndRebuilt) {
  const test::TempDir tmp = copy_fixture("tiny-gqa4-bf16", "damaged");
  const fs::path dir = tmp.path();
  const fs::path file = dir / "diffucoder-packed.bf16.bin";
  std::vector<float> fresh;
  {
    auto e = load(dir, std::nullopt);
    fresh = logits_of(*e);
  }
  const auto size = static_cast<int64_t>(fs::file_size(file));
  struct Damage {
    const char* what;
    std::function<void()> apply;
  };
  const std::vector<Damage> damages = {
      {"a flipped byte in the weights",
       [&] {
         std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(4096 + 100);
         char c;
         f.read(&c, 1);
         c = static_cast<char>(c ^ 0x5a);
         f.seekp(4096 + 100);
         f.write(&c, 1);
       }},
      {"truncated", [&] { fs::resize_file(file, static_cast<uintmax_t>(size / 2)); }},
      {"not a cache", [&] { std::ofstream(file, std::ios::trunc) << "hello"; }},
      {"empty", [&] { std::ofstream(file, std::ios::trunc); }},
  };
  for (const Damage& d : damages) {
    d.apply();
    auto e = load(dir, std::nullopt);
    EXPECT_EQ(e->weight_cache_report().outcome, WeightCacheReport::kWriting) << d.what;
    EXPECT_NE(e->weight_cache_report().note.find("damaged"), std::string::npos)
        << d.what << ": " << e->weight_cache_report().note;
    EXPECT_EQ(logits_of(*e), fresh) << d.what;
    e.reset();
    auto again = load(dir, std::nullopt);
    EXPECT_EQ(again->weight_cache_report().outcome, WeightCacheReport::kLoaded) << d.what;
    EXPECT_EQ(logits_of(*again), fresh) << d.what;
  }
}

TEST_F(WeightCache, ExplicitDirectoryAndQuantizedWeights) {
  if (!cpu::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX-512 VNNI: q8 weights are not packed on this CPU";
  const test::TempDir tmp = copy_fixture("tiny-gqa1", "q8src"), out("wcache_q8");
  const fs::path src = tmp.path(), q8 = fs::path(out.path()) / "q8", cache_dir = fs::path(out.path()) / "cache";
  ConvertOptions co;
  co.model_dir = src.string();
  co.out_dir = q8.string();
  ASSERT_TRUE(convert_checkpoint(co, nullptr).ok());
  std::vector<float> fresh;
  {
    auto e = load(q8, std::nullopt, cache_dir.string());
    EXPECT_EQ(e->weight_cache_report().outcome, WeightCacheReport::kWriting);
    EXPECT_EQ(fs::path(e->weight_cache_report().path).parent_path(), cache_dir);
    fresh = logits_of(*e);
  }
  auto warm = load(q8, std::nullopt, cache_dir.string());
  EXPECT_EQ(warm->weight_cache_report().outcome, WeightCacheReport::kLoaded) << warm->weight_cache_report().note;
  EXPECT_EQ(logits_of(*warm), fresh);
}

}  // namespace
}  // namespace dc
