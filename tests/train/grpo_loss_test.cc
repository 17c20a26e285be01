// The Coupled-GRPO loss (src/train/grpo_loss.h): its pieces on hand-made inputs, and the loss, its parts
// and every gradient against the PyTorch reference tests/reference/grpo_ref.py (fixtures of the ctest
// `grpo_fixtures`), through the library and through `diffucoder grpo-loss --json`; bad batches refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <nlohmann/json.hpp>

#include "engine_fixtures.h"
#include "fixtures.h"
#include "io/safetensors.h"
#include "lora/adapter.h"
#include "lora/trainable.h"
#include "model/params.h"
#include "model/transformer.h"
#include "process.h"
#include "train/grpo_loss.h"
#include "train/rollout.h"
#include "temp_dir.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
const fs::path kDir = DC_GRPO_FIXTURES_DIR;

TEST(GrpoAdvantages, LeaveOneOutPerGroup) {
  auto a = leave_one_out_advantages({1, 0, 2.5, 0.5, 3, 0}, 3, false);
  ASSERT_TRUE(a.ok());
  // group 1: 1 − (0 + 2.5)/2, 0 − 3.5/2, 2.5 − 1/2; group 2: 0.5 − 1.5, 3 − 0.25, 0 − 1.75
  const std::vector<double> want = {-0.25, -1.75, 2.0, -1.0, 2.75, -1.75};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_DOUBLE_EQ((*a)[i], want[i]) << i;
  auto equal = leave_one_out_advantages({2, 2, 2, 2}, 2, true);  // equal rewards: 0, also when scaled
  ASSERT_TRUE(equal.ok());
  for (double v : *equal) EXPECT_EQ(v, 0.0);
  auto scaled = leave_one_out_advantages({0, 1}, 2, true);  // ±1 / (std 0.7071 + 1e-4)
  ASSERT_TRUE(scaled.ok());
  EXPECT_NEAR((*scaled)[1], 1.0 / (std::sqrt(0.5) + 1e-4), 1e-12);
  auto nan = leave_one_out_advantages({std::nan(""), 1}, 2, false);  // NaN counts as 0
  ASSERT_TRUE(nan.ok());
  EXPECT_EQ((*nan)[0], -1.0);
  EXPECT_FALSE(leave_one_out_advantages({1, 2, 3}, 2, false).ok());
  EXPECT_FALSE(leave_one_out_advantages({1, 2}, 1, false).ok());
  // Rewards whose advantages overflow (2e308) or an infinite one are refused, naming the reward.
  auto huge = leave_one_out_advantages({1e308, -1e308}, 2, false);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("rewards[0]"), std::string::npos) << huge.status().message();
  EXPECT_FALSE(leave_one_out_advantages({1, std::numeric_limits<double>::infinity()}, 2, true).ok());
  EXPECT_TRUE(leave_one_out_advantages({kMaxAbsReward, -kMaxAbsReward}, 2, true).ok());
}

TEST(GrpoMasks, CoupledDraw) {
  double lo = 1, hi = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const CoupledMask c = draw_coupled_mask(3, 50, seed);
    lo = std::min(lo, c.t), hi = std::max(hi, c.t);
    const CoupledMask again = draw_coupled_mask(3, 50, seed);
    EXPECT_EQ(c.t, again.t);
    EXPECT_EQ(c.partial, again.partial);
    if (seed == 0) {
      int64_t n = 0;
      for (uint8_t p : c.partial) n += p;
      EXPECT_NEAR(static_cast<double>(n) / 150, c.t, 0.15) << "the partial mask covers about t of the positions";
    }
  }
  EXPECT_GE(lo, 0.2);
  EXPECT_LT(hi, 0.8);
  EXPECT_LT(lo, 0.25);
  EXPECT_GT(hi, 0.75);
}

TEST(GrpoMasks, ThreeVersionsNeverMaskThePrompt) {
  GrpoBatch b;
  b.n_batch = 2, b.n_prompt = 2, b.n_completion = 3;
  b.prompt_ids = {1, 2, 3, 4};
  b.completion_ids = {5, 6, 7, 8, 9, 10};
  b.completion_mask = {1, 1, 0, 1, 1, 1};
  CoupledMask m{0.25, {1, 0, 1, 0, 0, 1}};
  auto r = coupled_rows(b, m, 63, 64, false);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->n_batch, 6);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 2, 63, 63, 63, 3, 4, 63, 63, 63,     // v0: all masked
                                             1, 2, 63, 6, 63, 3, 4, 8, 9, 63,        // v1: the partial mask
                                             1, 2, 5, 63, 7, 3, 4, 63, 63, 10}));    // v2: its complement
  // 5 scored positions (one has completion_mask 0), two rows each; row of position j: (v·B + b)·5 + 2 + j − 1
  EXPECT_EQ(r->out_rows, (std::vector<int64_t>{1, 11, 2, 22, 6, 26, 7, 27, 8, 18}));
  EXPECT_EQ(r->factor, (std::vector<float>{0.5f, 2.0f, 0.5f, 0.5f / 0.75f, 0.5f, 0.5f / 0.75f, 0.5f, 0.5f / 0.75f,
                                           0.5f, 2.0f}));
  auto all = coupled_rows(b, m, 63, 64, true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->out_rows.size(), 12u);
  b.completion_ids[4] = 64;
  auto bad = coupled_rows(b, m, 63, 64, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("completion_ids[1][1]"), std::string::npos) << bad.status().message();
  b.completion_ids[4] = 9;
  m.t = 1.0;
  EXPECT_FALSE(coupled_rows(b, m, 63, 64, true).ok());
}

double rel_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) d += (got[i] - want[i]) * (got[i] - want[i]), r += want[i] * want[i];
  return std::sqrt(d) / std::max(std::sqrt(r), 1e-30);
}

std::vector<double> flat(const Json& j) {
  std::vector<double> out;
  if (j.is_number()) return {j.get<double>()};
  for (const Json& v : j) {
    const auto inner = flat(v);
    out.insert(out.end(), inner.begin(), inner.end());
  }
  return out;
}

Json load_cases() {
  EXPECT_TRUE(fs::exists(kDir / ".complete")) << "run `ctest -R grpo_fixtures` first";
  return testing::load_json((kDir / "cases.json").string());
}

// A scalar of the loss equals the reference's within 1e-4 of its size; the loss, a sum of per-token
// terms of both signs, within 1e-4 of the mean |term| when they cancel (g4_clip: 6e-4 from terms of ~1).
void expect_scalar(const Json& got, const Json& want, const std::string& key) {
  const double g = got.at(key), w = want.at(key);
  const double size = key == "loss" ? std::max(std::fabs(w), want.at("loss_scale").get<double>()) : std::fabs(w);
  EXPECT_NEAR(g, w, 1e-4 * std::max(size, 1e-6)) << key;
}

TEST(GrpoLossParity, CliMatchesTheReference) {
  const Json cases = load_cases();
  ASSERT_EQ(cases.size(), 5u);
  for (const Json& c : cases) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const std::string args = "grpo-loss --json --threads 2 --model " + (kDir / "policy").string() +
                             (c["ref"].get<bool>() ? " --ref-model " + (kDir / "ref").string() : std::string()) +
                             " --batch " + (kDir / (name + ".batch.json")).string();
    const testing::RunResult r = testing::run_binary(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Json got = Json::parse(r.out);
    const Json& want = c["expected"];
    for (const char* key : {"loss", "kl", "clip_fraction", "grad_norm"}) expect_scalar(got, want, key);
    for (const char* key : {"advantages", "logps", "ref_logps"})
      EXPECT_LE(rel_diff(flat(got.at(key)), flat(want.at(key))), 1e-4) << key;
    EXPECT_EQ(got.at("completion_mask"), want.at("completion_mask"));
    ASSERT_EQ(got.at("grad_norms").size(), want.at("grad_norms").size());
    for (auto it = want["grad_norms"].begin(); it != want["grad_norms"].end(); ++it)
      EXPECT_NEAR(got["grad_norms"].at(it.key()).get<double>(), it.value().get<double>(),
                  1e-4 * it.value().get<double>()) << it.key();
  }
}

// A case's grpo-loss batch as the library takes it (the parts grpo-loss parses from the file).
struct GrpoCase {
  GrpoBatch batch;
  Result<CoupledRows> rows = invalid_argument("not laid out");
  std::vector<double> advantages;
  std::vector<float> old_logps;
  GrpoLossOptions options;
  GrpoLossInputs inputs() const {
    GrpoLossInputs in;
    in.batch = &batch, in.rows = &*rows, in.advantages = advantages, in.old_logps = old_logps;
    return in;
  }
};

GrpoCase grpo_case(const Json& j, const ModelConfig& cfg) {
  GrpoCase k;
  GrpoBatch& b = k.batch;
  const int64_t G = j["group_size"];
  b.n_batch = static_cast<int64_t>(j["completion_ids"].size());
  b.n_completion = static_cast<int64_t>(j["completion_ids"][0].size());
  b.n_prompt = static_cast<int64_t>(j["prompt_ids"][0].size());
  const bool per_group = static_cast<int64_t>(j["prompt_ids"].size()) != b.n_batch;
  for (int64_t i = 0; i < b.n_batch; ++i)
    for (const Json& id : j["prompt_ids"][per_group ? i / G : i]) b.prompt_ids.push_back(id.get<int32_t>());
  if (j.contains("prompt_mask"))  // left_padded: the rollout's pads
    for (int64_t i = 0; i < b.n_batch; ++i)
      for (const Json& m : j["prompt_mask"][per_group ? i / G : i]) b.prompt_mask.push_back(m.get<uint8_t>());
  b.completion_ids = testing::flatten<int32_t>(j["completion_ids"]);
  for (int64_t i = 0; i < b.n_batch; ++i) {
    const auto mask = completion_mask(std::span(b.completion_ids).subspan(i * b.n_completion, b.n_completion),
                                      j["im_end_id"].get<int32_t>());
    b.completion_mask.insert(b.completion_mask.end(), mask.begin(), mask.end());
  }
  const CoupledMask m{j["t"].get<double>(), testing::flatten<uint8_t>(j["mask"])};
  k.rows = coupled_rows(b, m, static_cast<int32_t>(cfg.mask_token_id), cfg.n_vocab, false);
  std::vector<double> rewards;
  for (const Json& r : j["rewards"]) rewards.push_back(r.is_null() ? std::nan("") : r.get<double>());
  k.advantages = *leave_one_out_advantages(rewards, G, j.value("scale_rewards", false));
  if (j.contains("old_logps")) k.old_logps = testing::flatten<float>(j["old_logps"]);
  k.options.beta = j.value("beta", 0.01), k.options.epsilon = j.value("epsilon", 0.5);
  return k;
}

// The fixtures' policy and reference models and a context of two threads.
struct ParityModels {
  Result<std::unique_ptr<Model>> policy = Model::load((kDir / "policy").string());
  Result<std::unique_ptr<Model>> ref = Model::load((kDir / "ref").string());
  ThreadPool pool{2};
  Context ctx = [this] {
    Context c;
    c.pool = &pool;
    return c;
  }();
};

// The loss through the library, with every gradient tensor compared element-wise (≤ 1e-4 relative),
// and the same gradients bit for bit with gradient checkpointing, written over stale buffers (GradWrite::kOverwrite,
// the first micro-batch of a trainer's step).
TEST(GrpoLossParity, EveryGradientMatchesAutograd) {
  ParityModels m;
  ASSERT_TRUE(m.policy.ok() && m.ref.ok());
  auto& policy = m.policy;
  auto& ref = m.ref;
  const ModelConfig& cfg = (*policy)->config();
  const Context& ctx = m.ctx;
  for (const Json& c : load_cases()) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    GrpoCase k = grpo_case(c["batch"], cfg);
    ASSERT_TRUE(k.rows.ok()) << k.rows.status().message();
    const GrpoBatch& b = k.batch;
    const auto& rows = k.rows;
    GrpoLossInputs in = k.inputs();
    const GrpoLossOptions o = k.options;
    if (c["ref"].get<bool>()) in.ref_logps = *coupled_logps(ctx, **ref, *rows, b.n_completion);
    auto params = ModelParams::from_weights(cfg, (*policy)->weights());
    ASSERT_TRUE(params.ok());
    const auto model = Model::from_weights(cfg, params->weights(), nullptr);
    ModelParams grads = ModelParams::zeros(cfg), again = ModelParams::zeros(cfg);
    Activations acts, lean;
    lean.recompute = true;
    auto res = grpo_loss_and_grads(ctx, *model, in, o, 1.0f, grads, acts);
    ASSERT_TRUE(res.ok()) << res.status().message();
    expect_scalar(Json{{"loss", res->loss}}, c["expected"], "loss");
    std::fill_n(again.data(), again.n_values(), 1e30f);  // stale: kOverwrite must write every gradient
    ASSERT_TRUE(grpo_loss_and_grads(ctx, *model, in, o, 1.0f, again, lean, nullptr, GradWrite::kOverwrite).ok());
    auto want = SafetensorsFile::open((kDir / (name + ".grads.safetensors")).string());
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(want->tensors().size(), grads.tensors().size());
    for (size_t i = 0; i < grads.tensors().size(); ++i) {
      const auto& t = grads.tensors()[i];
      const TensorInfo* w = want->find(t.name);
      ASSERT_NE(w, nullptr) << t.name;
      const float* wd = static_cast<const float*>(w->data);
      const double d = rel_diff(std::vector<double>(t.data, t.data + t.size), std::vector<double>(wd, wd + t.size));
      EXPECT_LE(d, 1e-4) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, again.tensors()[i].data, t.size * sizeof(float))) << t.name << " (recompute)";
    }
  }
}

// grpo-loss --lora: LoRA adapters over the frozen policy (grpo_ref.py's LoRA cases, autograd through
// W + scaling·B·A): through the library every dA / dB within 1e-4 relative, and through the CLI the loss, KL,
// clip fraction and each tensor's gradient norm.
TEST(GrpoLossParity, LoraGradientsMatchAutograd) {
  ParityModels m;
  ASSERT_TRUE(m.policy.ok() && m.ref.ok());
  auto& policy = m.policy;
  auto& ref = m.ref;
  const ModelConfig& cfg = (*policy)->config();
  const Context& ctx = m.ctx;
  const Json lora_cases = testing::load_json((kDir / "lora" / "cases.json").string());
  ASSERT_EQ(lora_cases.size(), 2u);
  for (const Json& c : lora_cases) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const Json* batch = nullptr;
    const Json cases = load_cases();
    for (const Json& whole : cases)
      if (whole["name"] == name) batch = &whole["batch"];
    ASSERT_NE(batch, nullptr);
    const std::string adapter_dir = (kDir / c["adapter"].get<std::string>()).string();
    auto adapter = open_lora_adapter(adapter_dir);
    ASSERT_TRUE(adapter.ok()) << adapter.status().message();
    auto lora = LoraParams::from_adapter(*adapter, cfg);
    ASSERT_TRUE(lora.ok()) << lora.status().message();
    GrpoCase k = grpo_case(*batch, cfg);
    ASSERT_TRUE(k.rows.ok()) << k.rows.status().message();
    GrpoLossInputs in = k.inputs();
    if (c["ref"].get<bool>()) in.ref_logps = *coupled_logps(ctx, **ref, *k.rows, k.batch.n_completion);
    LoraParams grads = LoraParams::zeros_like(*lora);
    Activations acts;
    auto res = grpo_loss_and_lora_grads(ctx, **policy, in, k.options, 1.0f, lora->weights(), grads, acts);
    ASSERT_TRUE(res.ok()) << res.status().message();
    expect_scalar(Json{{"loss", res->loss}, {"kl", res->kl}}, c["expected"], "loss");
    expect_scalar(Json{{"kl", res->kl}}, c["expected"], "kl");
    auto want = SafetensorsFile::open((kDir / "lora" / (name + ".grads.safetensors")).string());
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(want->tensors().size(), grads.tensors().size());
    for (const LoraParams::Tensor& t : grads.tensors()) {
      const TensorInfo* w = want->find(t.name);
      ASSERT_NE(w, nullptr) << t.name;
      const float* wd = static_cast<const float*>(w->data);
      const float* gd = grads.data() + t.offset;
      EXPECT_LE(rel_diff(std::vector<double>(gd, gd + t.size), std::vector<double>(wd, wd + t.size)), 1e-4) << t.name;
    }
    const testing::RunResult r = testing::run_binary(
        "grpo-loss --json --threads 2 --model " + (kDir / "policy").string() + " --lora " + adapter_dir +
        (c["ref"].get<bool>() ? " --ref-model " + (kDir / "ref").string() : std::string()) + " --batch " +
        (kDir / (name + ".batch.json")).string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Json got = Json::parse(r.out);
    for (const char* key : {"loss", "kl", "clip_fraction"}) expect_scalar(got, c["expected"], key);
    ASSERT_EQ(got.at("grad_norms").size(), c["expected"]["grad_norms"].size());
    for (auto it = c["expected"]["grad_norms"].begin(); it != c["expected"]["grad_norms"].end(); ++it)
      EXPECT_NEAR(got["grad_norms"].at(it.key()).get<double>(), it.value().get<double>(), 1e-4 * it.value().get<double>())
          << it.key();
  }
}

// coupled_logps runs the lm_head and the log-softmax in blocks of rows (here 1200 rows: 512 + 512 + 176),
// with and without a workspace (reused across calls of different sizes): the log-probs of the loss's one
// product over every row.
TEST(GrpoLossParity, LogProbsInBlocksEqualTheLossPass) {
  auto policy = Model::load((kDir / "policy").string());
  ASSERT_TRUE(policy.ok());
  const ModelConfig& cfg = (*policy)->config();
  auto params = ModelParams::from_weights(cfg, (*policy)->weights());  // f32, as the trainer's
  ASSERT_TRUE(params.ok());
  const auto model = Model::from_weights(cfg, params->weights(), nullptr);
  ThreadPool pool(2);
  Context plain;
  plain.pool = &pool;
  Workspace ws;
  Context with_ws = plain;
  with_ws.workspace = &ws;
  auto batch_of = [&](int64_t C) {
    GrpoBatch b;
    b.n_batch = 2, b.n_prompt = 3, b.n_completion = C;
    for (int64_t i = 0; i < b.n_batch * (b.n_prompt + C); ++i)
      (i < b.n_batch * b.n_prompt ? b.prompt_ids : b.completion_ids).push_back(static_cast<int32_t>((7 + i * 31) % (cfg.n_vocab - 2)));
    b.completion_mask.assign(b.n_batch * C, 1);
    return b;
  };
  const GrpoBatch small = batch_of(20), b = batch_of(300);
  const auto small_rows = coupled_rows(small, draw_coupled_mask(2, 20, 5), static_cast<int32_t>(cfg.mask_token_id),
                                       cfg.n_vocab, false);
  const auto rows = coupled_rows(b, draw_coupled_mask(2, 300, 5), static_cast<int32_t>(cfg.mask_token_id), cfg.n_vocab, false);
  ASSERT_TRUE(small_rows.ok() && rows.ok());
  ASSERT_EQ(rows->out_rows.size(), 1200u);
  ASSERT_TRUE(coupled_logps(with_ws, *model, *small_rows, 20).ok());  // the workspace's block grows next
  const auto blocks = coupled_logps(with_ws, *model, *rows, 300), own = coupled_logps(plain, *model, *rows, 300);
  ASSERT_TRUE(blocks.ok() && own.ok());
  EXPECT_EQ(*blocks, *own);
  ModelParams grads = ModelParams::zeros(cfg);
  Activations acts;
  GrpoLossInputs in;
  in.batch = &b, in.rows = &*rows, in.advantages = {0.5, -0.5};
  auto res = grpo_loss_and_grads(with_ws, *model, in, GrpoLossOptions{}, 1.0f, grads, acts);
  ASSERT_TRUE(res.ok()) << res.status().message();
  ASSERT_EQ(res->logps.size(), blocks->size());
  for (size_t i = 0; i < blocks->size(); ++i) EXPECT_NEAR((*blocks)[i], res->logps[i], 1e-5f * (1 + std::fabs(res->logps[i]))) << i;
}

TEST(GrpoMasks, PromptMaskGivesTheRolloutsPaddingAndPositions) {
  GrpoBatch b;
  b.n_batch = 2, b.n_prompt = 3, b.n_completion = 2;
  b.prompt_ids = {63, 1, 2, 3, 4, 5};  // row 0: one left pad, then a prompt of 2
  b.completion_ids = {6, 7, 8, 9};
  b.completion_mask = {1, 1, 1, 1};
  b.prompt_mask = {0, 1, 1, 1, 1, 1};
  const CoupledMask m{0.5, {1, 0, 0, 1}};
  auto r = coupled_rows(b, m, 62, 64, false);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::vector<uint8_t> row0 = {0, 1, 1, 1, 1}, row1 = {1, 1, 1, 1, 1};
  const std::vector<int32_t> pos0 = {1, 0, 1, 2, 3}, pos1 = {0, 1, 2, 3, 4};  // pads at 1 (spec §3.3)
  for (int64_t v = 0; v < 3; ++v) {  // every version: the same mask and positions
    EXPECT_EQ(std::vector<uint8_t>(r->valid.begin() + (2 * v) * 5, r->valid.begin() + (2 * v + 1) * 5), row0) << v;
    EXPECT_EQ(std::vector<uint8_t>(r->valid.begin() + (2 * v + 1) * 5, r->valid.begin() + (2 * v + 2) * 5), row1) << v;
    EXPECT_EQ(std::vector<int32_t>(r->positions.begin() + (2 * v) * 5, r->positions.begin() + (2 * v + 1) * 5), pos0) << v;
    EXPECT_EQ(std::vector<int32_t>(r->positions.begin() + (2 * v + 1) * 5, r->positions.begin() + (2 * v + 2) * 5), pos1) << v;
  }
  const ForwardBatch fb = r->forward_batch();
  EXPECT_EQ(fb.valid, r->valid.data());
  EXPECT_EQ(fb.positions, r->positions.data());
  b.prompt_mask = {1, 1, 1, 1, 1, 1};  // no pad: the reference's form, no mask and default positions
  auto plain = coupled_rows(b, m, 62, 64, false);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->valid.empty() && plain->positions.empty());
  EXPECT_EQ(plain->forward_batch().valid, nullptr);
  const std::vector<std::pair<std::vector<uint8_t>, std::string>> bad = {
      {{0, 1, 1, 1, 1}, "prompt_mask must hold B·P = 6 entries"},
      {{1, 0, 1, 1, 1, 1}, "prompt_mask[0][1] = 0"},
      {{0, 1, 1, 1, 1, 2}, "prompt_mask[1][2] = 2"},
      {{0, 1, 1, 0, 0, 0}, "prompt_mask[1] has no prompt token"}};
  for (const auto& [mask, message] : bad) {
    b.prompt_mask = mask;
    auto e = coupled_rows(b, m, 62, 64, false);
    ASSERT_FALSE(e.ok()) << message;
    EXPECT_NE(e.status().message().find(message), std::string::npos) << e.status().message();
  }
}

// Issue 42 item 6: two prompts of different lengths rolled out in one generation (the shorter left-padded,
// masked and renumbered by the decoder) are scored as the rollout saw them: the shorter prompt's
// completions get the log-probs of scoring them alone (no pads), in the no-grad pass and in the loss's
// training forward; without the prompt mask (the old scoring) they do not.
TEST(GrpoLossPadding, ShorterPromptScoresAsAlone) {
  auto engine = testing::load_exact((fs::path(testing::fixtures_dir()) / "tiny-vocab").string(), 2);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const ModelConfig& cfg = (*engine)->config();
  auto params = ModelParams::from_weights(cfg, (*engine)->model().weights());
  ASSERT_TRUE(params.ok());
  const auto policy = Model::from_weights(cfg, params->weights(), nullptr);
  Context ctx;
  ctx.pool = &(*engine)->pool();
  ctx.matmul_precision = MatmulPrecision::kF32;
  RolloutOptions ro;
  ro.group_size = 2;
  ro.sampling = recipe_rollout_params(cfg);
  ro.sampling.max_new_tokens = 8, ro.sampling.steps = 8;
  const Tokenizer& tok = *(*engine)->tokenizer();
  const std::vector<std::vector<int32_t>> prompts = {*tok.encode("def add(a, b):\n    return"), *tok.encode("x =")};
  ASSERT_GT(prompts[0].size(), prompts[1].size() + 2);
  auto rb = generate_rollouts(ctx, *policy, tok, prompts, ro, 21);
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  const int64_t P = rb->prompt_width, C = rb->completion_length, B = rb->n_rows;  // rows 2, 3: the short prompt
  GrpoBatch both;
  both.n_batch = B, both.n_prompt = P, both.n_completion = C;
  both.prompt_ids = rb->prompt_ids, both.prompt_mask = rb->prompt_mask;
  both.completion_ids = rb->completion_ids;
  both.completion_mask.assign(B * C, 1);
  const CoupledMask mask = draw_coupled_mask(B, C, 9);
  GrpoBatch alone;  // the short prompt's two completions with no pads
  const int64_t Ps = static_cast<int64_t>(prompts[1].size());
  alone.n_batch = 2, alone.n_prompt = Ps, alone.n_completion = C;
  for (int g = 0; g < 2; ++g) alone.prompt_ids.insert(alone.prompt_ids.end(), prompts[1].begin(), prompts[1].end());
  alone.completion_ids.assign(rb->completion_ids.begin() + 2 * C, rb->completion_ids.end());
  alone.completion_mask.assign(2 * C, 1);
  const CoupledMask alone_mask{mask.t, std::vector<uint8_t>(mask.partial.begin() + 2 * C, mask.partial.end())};
  const int32_t mask_id = static_cast<int32_t>(cfg.mask_token_id);
  auto rows = coupled_rows(both, mask, mask_id, cfg.n_vocab, false);
  auto alone_rows = coupled_rows(alone, alone_mask, mask_id, cfg.n_vocab, false);
  GrpoBatch unmasked = both;
  unmasked.prompt_mask.clear();
  auto unmasked_rows = coupled_rows(unmasked, mask, mask_id, cfg.n_vocab, false);
  ASSERT_TRUE(rows.ok() && alone_rows.ok() && unmasked_rows.ok());
  auto logps = coupled_logps(ctx, *policy, *rows, C);
  auto alone_logps = coupled_logps(ctx, *policy, *alone_rows, C);
  auto unmasked_logps = coupled_logps(ctx, *policy, *unmasked_rows, C);
  ASSERT_TRUE(logps.ok() && alone_logps.ok() && unmasked_logps.ok());
  ModelParams grads = ModelParams::zeros(cfg);
  Activations acts;
  GrpoLossInputs in;
  in.batch = &both, in.rows = &*rows, in.advantages = {0.5, -0.5, 1.0, -1.0};
  auto res = grpo_loss_and_grads(ctx, *policy, in, GrpoLossOptions{}, 1.0f, grads, acts);
  ASSERT_TRUE(res.ok()) << res.status().message();
  double unmasked_gap = 0;
  for (int64_t i = 0; i < 2 * C; ++i) {
    const float want = (*alone_logps)[i];
    EXPECT_NEAR((*logps)[2 * C + i], want, 1e-5f * (1 + std::fabs(want))) << "position " << i;
    EXPECT_NEAR(res->logps[2 * C + i], want, 1e-5f * (1 + std::fabs(want))) << "position " << i << " (loss pass)";
    unmasked_gap = std::max(unmasked_gap, std::fabs(static_cast<double>((*unmasked_logps)[2 * C + i]) - want));
  }
  EXPECT_GT(unmasked_gap, 1e-3) << "attending the pads changes the log-probs (the scoring before the fix)";
  for (int64_t i = 0; i < 2 * C; ++i)  // the long prompt has no pads: the same either way, bit for bit
    EXPECT_EQ((*logps)[i], (*unmasked_logps)[i]) << i;
}

TEST(GrpoLossCli, BadBatchesGetClearErrors) {
  const Json cases = load_cases();
  ASSERT_FALSE(cases.empty());
  const Json good = cases[0]["batch"];
  const test::TempDir tmp("grpo_bad");
  const fs::path dir = tmp.path();
  auto run = [&](const Json& batch) {
    const fs::path p = dir / "batch.json";
    std::ofstream(p) << batch.dump();
    return testing::run_binary("grpo-loss --json --model " + (kDir / "policy").string() + " --batch " + p.string());
  };
  auto edit = [&](const std::function<void(Json&)>& f) {
    Json j = good;
    f(j);
    return j;
  };
  const std::vector<std::pair<Json, std::string>> bad = {
      {edit([](Json& j) { j.erase("t"); }), "missing key 't'"},
      {edit([](Json& j) { j["tt"] = 1; }), "unknown key 'tt'"},
      {edit([](Json& j) { j["t"] = 1.5; }), "t must be in (0, 1)"},
      // Probe finding 6: these printed NaN with exit 0 (1/t overflows f32; the advantages overflow double).
      {edit([](Json& j) { j["t"] = 1e-320; }), "t must be in (0, 1), at least 1e-6 from either end"},
      {edit([](Json& j) { j["rewards"][0] = 1e308, j["rewards"][1] = -1e308; }), "rewards[0] = 1e+308 is beyond"},
      {edit([](Json& j) { j["old_logps"] = Json::array(); for (int b = 0; b < 4; ++b) j["old_logps"].push_back(Json::array({1e300, 0, 0, 0, 0, 0, 0, 0})); }),
       "old_logps[0] is inf"},
      {edit([](Json& j) { j["group_size"] = 3; }), "group_size 3"},
      {edit([](Json& j) { j["group_size"] = 1; }), "group_size 1"},
      {edit([](Json& j) { j["rewards"].erase(0); }), "'rewards' must be a list of 4"},
      {edit([](Json& j) { j["rewards"][1] = "x"; }), "'rewards' holds \"x\""},
      {edit([](Json& j) { j["completion_ids"][1].erase(0); }), "completion_ids[1] must be a list of 8"},
      {edit([](Json& j) { j["completion_ids"][2][3] = 64; }), "completion_ids[2][3] = 64 is outside the vocabulary"},
      {edit([](Json& j) { j["completion_ids"][2][3] = -1; }), "not a non-negative integer"},
      {edit([](Json& j) { j["prompt_ids"][0].push_back(1); }), "prompt_ids[1] must be a list of 6"},
      {edit([](Json& j) { j["mask"][0][0] = 2; }), "'mask' entries must be 0 or 1"},
      {edit([](Json& j) { j["prompt_mask"] = Json::array({Json::array({1, 1})}); }), "'prompt_mask' must be a list of 4"},
      {edit([](Json& j) { j["prompt_mask"] = Json::array(); for (int b = 0; b < 4; ++b) j["prompt_mask"].push_back(Json::array({1, 0, 1, 1, 1})); }),
       "prompt_mask[0][1] = 0"},
      {edit([](Json& j) { j["old_logps"] = Json::array({Json::array({0.1})}); }), "'old_logps' must be a list of 4"},
      {edit([](Json& j) { j["epsilon"] = -1; }), "'epsilon' must be a number"},
      {edit([](Json& j) { j.erase("im_end_id"); }), "give 'im_end_id' in the batch"},
      {Json::array(), "one JSON object"},
  };
  for (const auto& [batch, message] : bad) {
    const testing::RunResult r = run(batch);
    EXPECT_EQ(r.exit_code, 1) << message;
    EXPECT_NE(r.err.find(message), std::string::npos) << "want '" << message << "' in: " << r.err;
  }
  {
    std::ofstream(dir / "batch.json") << "{not json";
    const auto r = testing::run_binary("grpo-loss --model " + (kDir / "policy").string() + " --batch " +
                                       (dir / "batch.json").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("not JSON"), std::string::npos) << r.err;
  }
  const auto missing = testing::run_binary("grpo-loss --model " + (kDir / "policy").string() + " --batch " +
                                           (dir / "none.json").string());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("none.json"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace dc::train
