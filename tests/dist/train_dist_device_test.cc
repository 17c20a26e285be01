// Training over ranks each on its own device (`train --device vulkan`, `grpo_dist_check --device`; both ranks on
// lavapipe's device 0) against one process on the device and the CPU's ranks: full fine-tunes (ZeRO-2, the Adam
// moments of each rank's shard on its device) and LoRA adapters. Registered only when MPI is built; skipped without
// a Vulkan device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "train_dist.h"

namespace dc {
namespace {

// The MiB a device run's logged memory plan gives after `key` (", Adam moments "); -1 when it has none.
double plan_mib(const std::string& out, const std::string& key) {
  const size_t at = out.find(key);
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + key.size());
}

// Two moment shards (a checkpoint's optimizer-rank*.safetensors: m and v of the same range): ‖a − b‖ / ‖a‖ within
// 1e-5 for each, and every value within 1e-5 of the largest (measured below 1e-6 on lavapipe against the CPU).
void expect_moments_close(const fs::path& a_path, const fs::path& b_path) {
  auto a = SafetensorsFile::open(a_path.string());
  auto b = SafetensorsFile::open(b_path.string());
  ASSERT_TRUE(a.ok() && b.ok()) << a_path << " " << b_path;
  for (const char* name : {"m", "v"}) {
    const TensorInfo *ta = a->find(name), *tb = b->find(name);
    ASSERT_TRUE(ta != nullptr && tb != nullptr && ta->n_bytes == tb->n_bytes) << name << " of " << b_path;
    const auto* x = reinterpret_cast<const float*>(ta->data);
    const auto* y = reinterpret_cast<const float*>(tb->data);
    double diff2 = 0, norm2 = 0, worst = 0, scale = 0;
    for (size_t i = 0; i < ta->n_bytes / sizeof(float); ++i) {
      const double d = std::fabs(double(x[i]) - y[i]);
      diff2 += std::isnan(d) ? INFINITY : d * d, norm2 += double(x[i]) * x[i];
      worst = std::max(worst, std::isnan(d) ? INFINITY : d), scale = std::max(scale, std::fabs(double(x[i])));
    }
    ASSERT_GT(norm2, 0) << name << " of " << a_path << ": all zero";
    std::printf("  %s of %s: norm %.2e, max %.2e\n", name, b_path.filename().c_str(), std::sqrt(diff2 / norm2), worst / scale);
    EXPECT_LT(std::sqrt(diff2 / norm2), 1e-5) << name << " of " << b_path;
    EXPECT_LE(worst, 1e-5 * scale) << name << " of " << b_path;
  }
}

bool have_vulkan() { return testing::run_binary("devices").out.find("vulkan:0") != std::string::npos; }

// A checkpoint for the device tests in dir/small_vocab (made once): tiny-vocab read with head_dim 16 (the
// device's attention) and its first 4096 vocabulary rows (the data's ids are below 2100; the special ids moved
// below 4096, the pad id 4094): the 152k-row lm_head takes seconds per pass on lavapipe.
fs::path small_vocab_model(const fs::path& dir) {
  constexpr int64_t kVocab = 4096;
  const fs::path model = dir / "small_vocab", from = testing::fixtures_dir() + "/tiny-vocab";
  if (fs::exists(model / "model.safetensors")) return model;
  fs::create_directories(model);
  fs::create_symlink(from / "tokenizer.json", model / "tokenizer.json");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(from / "config.json"));
  config["num_attention_heads"] = 2, config["num_key_value_heads"] = 1, config["vocab_size"] = kVocab;
  config["mask_token_id"] = kVocab - 1, config["pad_token_id"] = kVocab - 2;
  config["bos_token_id"] = config["eos_token_id"] = kVocab - 3;
  std::ofstream(model / "config.json") << config.dump(2);
  auto base = SafetensorsFile::open((from / "model.safetensors").string());
  EXPECT_TRUE(base.ok());
  std::vector<TensorToWrite> sliced;
  for (const auto& [name, t] : base->tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (shape[0] == 152064) shape[0] = kVocab;  // the embedding table's and lm_head's first rows
    sliced.push_back({name, t.dtype, shape, t.data});
  }
  EXPECT_TRUE(write_safetensors((model / "model.safetensors").string(), sliced).ok());
  return model;
}

// The three runs the device tests compare, `run(ranks, out, device)` each: one process on the device (`one`,
// into PREFIX_one), 2 ranks on it (`two`, PREFIX_two) and the CPU's 2 ranks (PREFIX_cpu); each must succeed.
template <class Run>
std::vector<testing::RunResult> device_runs(const Run& run, const std::string& prefix, const std::string& one,
                                            const std::string& two) {
  std::vector<testing::RunResult> r = {run(1, prefix + "_one", one), run(2, prefix + "_two", two),
                                       run(2, prefix + "_cpu", "cpu")};
  for (const testing::RunResult& x : r) EXPECT_EQ(x.exit_code, 0) << x.out;
  return r;
}

// `train --device vulkan` on 2 ranks, each on device 0 (lavapipe exposes one: the map vulkan:0,0, then
// vulkan:0), 2 steps of one 16-token micro-batch per rank on small_vocab_model, clipped: the losses, gradient
// norms and final weights equal one process on the device and the CPU's 2 ranks within the device tests' f32
// bounds (AdamW's eps 1e-3, as there); each rank's device holds the Adam moments of its shard (its plan's are half
// of one process's) and saves them equal to the CPU ranks' within f32 bounds (AdamW of the shard ran there); the run
// resumed from its step-1 checkpoint is bit-identical; a map naming a device a rank cannot open is refused naming
// the rank and device.
TEST_F(TrainDist, VulkanRanksEqualOneProcessOnTheDevice) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const fs::path model = small_vocab_model(dir_);
  const auto run = [&](int ranks, const std::string& out, const std::string& device, const std::string& extra = "") {
    testing::RunResult r = testing::run_command(
        launcher(ranks, /*device=*/true) + DC_BINARY_PATH + " train --model " + model.string() + " --data " + path("sft.jsonl").string() +
        " --steps 2 --save-every 1 --precision f32 --seq-len 16 --batch-size 1 --grad-accum 2 --lr 2e-3 --warmup-steps 0"
        " --adam-eps 1e-3 --weight-decay 0.1 --max-grad-norm 1 --pad-id 4094 --threads 1 --quiet --out " + path(out).string() +
        " --device " + device + " " + extra);
    r.out += r.err;
    return r;
  };
  const auto runs = device_runs(run, "vk", "vulkan", "vulkan:0,0");
  if (HasFailure()) return;
  const testing::RunResult &one = runs[0], &two = runs[1];
  // The memory plan counts what a rank holds on its device: the moments of its shard, half of one process's.
  const double moments_one = plan_mib(one.out, ", Adam moments "), moments_two = plan_mib(two.out, ", Adam moments ");
  EXPECT_NEAR(moments_two, moments_one / 2, 0.1) << two.out;
  EXPECT_NE(two.out.find("(the Adam moments of this rank's shard)"), std::string::npos) << two.out;
  // Each rank's moments (AdamW on its device, saved from there) are the CPU ranks' within f32 bounds.
  for (int rank = 0; rank < 2; ++rank) {
    const std::string f = "optimizer-rank0000" + std::to_string(rank) + "-of-00002.safetensors";
    expect_moments_close(path("vk_cpu") / "checkpoint-000002" / f, path("vk_two") / "checkpoint-000002" / f);
  }
  const auto metrics = [&](const std::string& out) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(path(out) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  const auto m_two = metrics("vk_two");
  ASSERT_EQ(m_two.size(), 2u);
  for (const char* other : {"vk_one", "vk_cpu"}) {
    const auto m = metrics(other);
    ASSERT_EQ(m.size(), 2u) << other;
    for (size_t k = 0; k < 2; ++k)
      for (const char* key : {"loss", "grad_norm"}) {
        const double want = m[k][key], got = m_two[k][key];
        EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << key << " of step " << k + 1 << " against " << other;
      }
    EXPECT_GT(m[0]["grad_norm"].get<double>(), 1.0) << "the test wants clipping on";
    // Every tensor's distance from the other run's weights, against its update (the device tests' bound).
    const fs::path last = fs::path("checkpoint-000002") / "model.safetensors";
    auto a = SafetensorsFile::open((path(other) / last).string());
    auto b = SafetensorsFile::open((path("vk_two") / last).string());
    auto p0 = SafetensorsFile::open((model / "model.safetensors").string());
    ASSERT_TRUE(a.ok() && b.ok() && p0.ok()) << other;
    for (const auto& [name, ta] : a->tensors()) {
      if (name.find("k_proj.bias") != std::string::npos) continue;  // its exact gradient is zero (see difference)
      const TensorInfo* tb = b->find(name);
      const TensorInfo* t0 = p0->find(name);
      ASSERT_TRUE(tb != nullptr && t0 != nullptr && tb->n_bytes == ta.n_bytes) << name;
      const auto* x = reinterpret_cast<const float*>(ta.data);
      const auto* y = reinterpret_cast<const float*>(tb->data);
      ASSERT_EQ(t0->dtype, DType::kBF16) << name << ": the fixture's weights are bf16";
      const auto* w0 = reinterpret_cast<const uint16_t*>(t0->data);
      double step = 0, diff = 0;
      for (size_t i = 0; i < ta.n_bytes / sizeof(float); ++i) {
        step = std::max(step, std::fabs(double(x[i]) - bf16_to_f32(w0[i])));
        const double d = std::fabs(double(x[i]) - y[i]);
        diff = std::isnan(d) ? INFINITY : std::max(diff, d);
      }
      ASSERT_GT(step, 0) << name << ": not updated";
      EXPECT_LE(diff, 2e-4 * step) << name << " against " << other;
    }
  }
  // Resumed from the step-1 checkpoint on 2 ranks: the uninterrupted run bit for bit.
  fs::copy(path("vk_two"), path("vk_resumed"), fs::copy_options::recursive);
  fs::remove_all(path("vk_resumed") / "checkpoint-000002");
  const auto resumed = run(2, "vk_resumed", "vulkan:0", "--resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : {"model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                        "optimizer-rank00001-of-00002.safetensors"})
    EXPECT_TRUE(read_bytes(path("vk_two") / "checkpoint-000002" / f) == read_bytes(path("vk_resumed") / "checkpoint-000002" / f))
        << f;
  // Rank 1 mapped to a device that is not there: refused, naming the rank and the device.
  const auto bad = run(2, "vk_bad", "vulkan:0,7");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("rank 1 (local rank 1): --device vulkan:0,7 is vulkan:7 here"), std::string::npos) << bad.out;
}

// Coupled-GRPO on a device per rank (grpo_dist_check --device vulkan:0, both ranks on lavapipe's device 0, on
// small_vocab_model): 2 ranks end with the weights and the reference model of one process on the device and of
// the CPU's 2 ranks within f32 bounds, and the same loss curve.
TEST_F(TrainDist, GrpoVulkanRanksEqualOneProcessOnTheDevice) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const fs::path model = small_vocab_model(dir_);
  const auto grpo = [&](int ranks, const std::string& out, const std::string& device) {
    testing::RunResult r = testing::run_command(launcher(ranks, /*device=*/true) + DC_GRPO_DIST_CHECK + " " +
                                                model.string() + " " + path(out).string() + " --device " + device);
    r.out += r.err;
    return r;
  };
  const char* kLast = "checkpoint-000004";
  device_runs(grpo, "gv", "vulkan:0", "vulkan:0");
  if (HasFailure()) return;
  const auto l2 = losses(path("gv_two/metrics.jsonl"));
  ASSERT_EQ(l2.size(), 4u);
  for (const char* other : {"gv_one", "gv_cpu"}) {
    for (const char* f : {"model.safetensors", "ref_model.safetensors"}) {
      const Difference d = difference(path(other) / kLast / f, path("gv_two") / kLast / f);
      std::printf("  %s vs 2 ranks on the device, %s: norm %.2e, max %.2e\n", other, f, d.norm_relative, d.max_relative);
      EXPECT_LT(d.norm_relative, 1e-5) << other << " " << f;
      EXPECT_LT(d.max_relative, 1e-5) << other << " " << f;
    }
    const auto l = losses(path(other) / "metrics.jsonl");
    ASSERT_EQ(l.size(), 4u) << other;
    for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l2[i], l[i], 1e-4 * std::fabs(l[i]) + 1e-9) << other << " step " << i + 1;
  }
}

// LoRA adapters (`train --lora-r 4 --device`) on 2 ranks each on lavapipe's device 0: the adapters' gradients summed
// over the ranks on the host, AdamW on each rank's device. 2 steps of one 16-token micro-batch per rank, clipped:
// the losses and gradient norms equal one process on the device within the device tests' f32 bounds, each adapter
// tensor within 2e-4 of its step-2 update, and the run resumed from its step-1 checkpoint is bit-identical.
TEST_F(TrainDist, LoraVulkanRanksEqualOneProcessOnTheDevice) {
  if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  const fs::path model = small_vocab_model(dir_);
  const auto run = [&](int ranks, const std::string& out, const std::string& device, const std::string& extra = "") {
    testing::RunResult r = testing::run_command(
        launcher(ranks, /*device=*/true) + DC_BINARY_PATH + " train --model " + model.string() + " --data " +
        path("sft.jsonl").string() + " --steps 2 --save-every 1 --precision f32 --seq-len 16 --batch-size 1 --grad-accum 2"
        " --lr 2e-2 --warmup-steps 0 --adam-eps 1e-3 --max-grad-norm 0.01 --lora-r 4 --lora-alpha 8 --lora-dropout 0"
        " --pad-id 4094 --threads 1 --quiet --out " + path(out).string() + " --device " + device + " " + extra);
    r.out += r.err;
    return r;
  };
  const auto one = run(1, "lv_one", "vulkan"), two = run(2, "lv_two", "vulkan:0,0");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  ASSERT_EQ(two.exit_code, 0) << two.out;
  const auto metrics = [&](const std::string& out) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(path(out) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  const auto m_one = metrics("lv_one"), m_two = metrics("lv_two");
  ASSERT_EQ(m_one.size(), 2u);
  ASSERT_EQ(m_two.size(), 2u);
  for (size_t k = 0; k < 2; ++k)
    for (const char* key : {"loss", "grad_norm"}) {
      const double want = m_one[k][key], got = m_two[k][key];
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << key << " of step " << k + 1;
    }
  EXPECT_GT(m_one[0]["grad_norm"].get<double>(), 0.01) << "the test wants clipping on";
  const auto adapters = [&](const std::string& out, const char* checkpoint) {
    auto f = SafetensorsFile::open((path(out) / checkpoint / "adapter_model.safetensors").string());
    EXPECT_TRUE(f.ok()) << out << " " << checkpoint;
    return f;
  };
  auto one1 = adapters("lv_one", "checkpoint-000001"), one2 = adapters("lv_one", "checkpoint-000002");
  auto two2 = adapters("lv_two", "checkpoint-000002");
  ASSERT_TRUE(one1.ok() && one2.ok() && two2.ok());
  ASSERT_FALSE(one2->tensors().empty());
  for (const auto& [name, t] : one2->tensors()) {
    const TensorInfo *before = one1->find(name), *other = two2->find(name);
    ASSERT_TRUE(before != nullptr && other != nullptr && other->n_bytes == t.n_bytes) << name;
    const auto* x = reinterpret_cast<const float*>(t.data);
    const auto* x1 = reinterpret_cast<const float*>(before->data);
    const auto* y = reinterpret_cast<const float*>(other->data);
    double step = 0, diff = 0;
    for (size_t i = 0; i < t.n_bytes / sizeof(float); ++i) {
      step = std::max(step, std::fabs(double(x[i]) - x1[i]));
      const double d = std::fabs(double(x[i]) - y[i]);
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    }
    ASSERT_GT(step, 0) << name << ": not updated";
    EXPECT_LE(diff, 2e-4 * step) << name;
  }
  // Resumed from the step-1 checkpoint on 2 ranks: the uninterrupted run bit for bit.
  fs::copy(path("lv_two"), path("lv_resumed"), fs::copy_options::recursive);
  fs::remove_all(path("lv_resumed") / "checkpoint-000002");
  const auto resumed = run(2, "lv_resumed", "vulkan:0", "--resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : {"adapter_model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_bytes(path("lv_two") / "checkpoint-000002" / f) == read_bytes(path("lv_resumed") / "checkpoint-000002" / f))
        << f;
}

}  // namespace
}  // namespace dc
