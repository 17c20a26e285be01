// The trainers against hostile state and numbers (issue 41, probe findings 4-6): a tampered or missing
// trainer_state.json is refused naming the file and the field (never a crash, NaN weights or a silent
// restart); NaN options are refused by the library (the C++ API and Python reach it without the CLI); a
// non-finite loss or gradient norm skips the update, keeping the weights, and stops the run after
// kMaxConsecutiveSkips; GRPO refuses rewards whose advantages would overflow, naming the step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "train/grpo_trainer.h"
#include "train/trainer.h"
#include "temp_dir.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
const fs::path kGuardSftModel = fs::path(DC_GRAD_FIXTURES_DIR) / "tiny-train";
const fs::path kGuardGrpoModel = fs::path(DC_GRPO_FIXTURES_DIR) / "policy";

// 8 sequences of 16 ids below 60 (the fixture's mask and pad are 62 and 63).
Dataset guard_corpus() {
  Dataset ds;
  for (int s = 0; s < 8; ++s) {
    TrainSequence seq;
    for (int j = 0; j < 16; ++j) seq.tokens.push_back((s * 7 + j * 3) % 60);
    seq.loss_mask.assign(16, 1);
    ds.sequences.push_back(std::move(seq));
  }
  return ds;
}

TrainOptions guard_sft_options(const std::string& out, int64_t steps) {
  TrainOptions o;
  o.model_dir = kGuardSftModel.string();
  o.data_path = "guard-corpus";
  o.out_dir = out;
  o.seq_len = 16, o.batch_size = 2, o.grad_accum = 1, o.steps = steps;
  o.lr.lr = 1e-3, o.lr.total_steps = steps;
  o.precision = MatmulPrecision::kF32;
  return o;
}

bool same_values(const ModelParams& a, const ModelParams& b) {
  return a.n_values() == b.n_values() && std::memcmp(a.data(), b.data(), a.n_values() * sizeof(float)) == 0;
}

class TrainGuard : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(fs::path(DC_GRAD_FIXTURES_DIR) / ".complete")) << "run `ctest -R grad_fixtures` first";
    ctx_.pool = &pool_;
  }
  // A run of `steps` steps saved in out (checkpoint-<steps>).
  void train_and_save(const std::string& out, int64_t steps) {
    auto t = Trainer::create_with_data(guard_sft_options(out, steps), ctx_, guard_corpus());
    ASSERT_TRUE(t.ok()) << t.status().message();
    while ((*t)->steps_done() < steps) ASSERT_TRUE((*t)->step().ok());
    ASSERT_TRUE((*t)->save().ok());
  }
  ThreadPool pool_{2};
  Context ctx_;
};

// Probe finding 4: each tampered field of trainer_state.json is refused naming the file and the field
// (the old code crashed on cursor -3, trained NaN weights on step -5, ran on to step 99999999999).
TEST_F(TrainGuard, TamperedTrainerStateIsRefusedNamingTheField) {
  const test::TempDir tmp("guard_state");
  const std::string out = tmp.file("out");
  train_and_save(out, 2);
  const fs::path state_path = fs::path(out) / "checkpoint-000002" / "trainer_state.json";
  std::string original;
  {
    std::ifstream in(state_path);
    std::stringstream ss;
    ss << in.rdbuf();
    original = ss.str();
  }
  const Json good = Json::parse(original);
  EXPECT_EQ(good["cursor"], 4);  // 2 steps x batch 2
  struct Case {
    std::function<void(Json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](Json& j) { j["cursor"] = -3; }, "'cursor'"},
      {[](Json& j) { j["cursor"] = 5; }, "'cursor' is 5"},
      {[](Json& j) { j["step"] = -5; }, "'step'"},
      {[](Json& j) { j["step"] = 99999999999LL; }, "'step' is 99999999999"},
      {[](Json& j) { j["step"] = 1.5; }, "'step'"},
      {[](Json& j) { j["step"] = "2"; }, "'step'"},
      {[](Json& j) { j.erase("step"); }, "'step' is missing"},
      {[](Json& j) { j["seed"] = -1; }, "'seed'"},
      {[](Json& j) { j["seed"] = 43; }, "'seed' is 43"},
      {[](Json& j) { j["options"] = 7; }, "'options'"},
      {[](Json& j) { j["optimizer_shards"] = 0; }, "'optimizer_shards'"},
      {[](Json& j) { j["skipped_steps"] = 3; }, "'skipped_steps'"},
      {[](Json& j) { j = Json::array(); }, "not a JSON object"},
  };
  TrainOptions o = guard_sft_options(out, 2);
  o.resume = true;
  for (const Case& c : cases) {
    Json j = good;
    c.edit(j);
    std::ofstream(state_path) << j.dump();
    auto t = Trainer::create_with_data(o, ctx_, guard_corpus());
    ASSERT_FALSE(t.ok()) << c.field;
    EXPECT_NE(t.status().message().find(state_path.string()), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.field), std::string::npos) << c.field << " in: " << t.status().message();
  }
  std::ofstream(state_path) << "{not json";
  EXPECT_FALSE(Trainer::create_with_data(o, ctx_, guard_corpus()).ok());
  std::ofstream(state_path) << original;
  auto resumed = Trainer::create_with_data(o, ctx_, guard_corpus());
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ((*resumed)->steps_done(), 2);
}

// A checkpoint whose trainer_state.json is gone is an error naming the file, not a silent restart from
// step 0 that overwrites the checkpoints; non-finite moments are refused naming the tensor.
TEST_F(TrainGuard, MissingStateOrNonFiniteMomentsAreRefused) {
  const test::TempDir tmp("guard_missing");
  const std::string out = tmp.file("out");
  train_and_save(out, 2);
  const fs::path ckpt = fs::path(out) / "checkpoint-000002";
  fs::copy_file(ckpt / "trainer_state.json", tmp.file("state.json"));
  fs::remove(ckpt / "trainer_state.json");
  TrainOptions o = guard_sft_options(out, 4);
  o.resume = true;
  auto t = Trainer::create_with_data(o, ctx_, guard_corpus());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find((ckpt / "trainer_state.json").string() + " is missing"), std::string::npos)
      << t.status().message();
  EXPECT_FALSE(fs::exists(fs::path(out) / "checkpoint-000004"));
  fs::copy_file(tmp.file("state.json"), ckpt / "trainer_state.json");

  // v < 0 in optimizer.safetensors (sqrt of it is NaN).
  std::vector<std::vector<float>> copies;
  std::vector<TensorToWrite> tensors;
  {
    auto moments = SafetensorsFile::open((ckpt / "optimizer.safetensors").string());
    ASSERT_TRUE(moments.ok()) << moments.status().message();
    for (const auto& [name, info] : moments->tensors()) {
      const auto* data = reinterpret_cast<const float*>(info.data);
      copies.emplace_back(data, data + info.n_bytes / sizeof(float));
      if (name == "v.model.norm.weight") copies.back()[1] = -1.0f;
      tensors.push_back({name, DType::kF32, info.shape, nullptr});
    }
  }  // unmapped before it is replaced
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = copies[i].data();
  ASSERT_TRUE(write_safetensors((ckpt / "optimizer.safetensors").string(), tensors).ok());
  auto bad = Trainer::create_with_data(o, ctx_, guard_corpus());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("v.model.norm.weight"), std::string::npos) << bad.status().message();
}

// Probe finding 5 at the library level: NaN (and inf, and the betas at 1) are refused naming the field,
// whatever the caller (the CLI refuses them earlier, with exit 2).
TEST_F(TrainGuard, NonFiniteOptionsAreRefusedByTheLibrary) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::function<void(TrainOptions&)>, std::string>> sft = {
      {[&](TrainOptions& o) { o.lr.lr = nan; }, "lr"},
      {[&](TrainOptions& o) { o.lr.lr = inf; }, "lr"},
      {[&](TrainOptions& o) { o.lr.min_lr_ratio = nan; }, "min_lr_ratio"},
      {[&](TrainOptions& o) { o.adam.beta1 = nan; }, "beta1"},
      {[&](TrainOptions& o) { o.adam.beta2 = 1.0; }, "beta2"},
      {[&](TrainOptions& o) { o.adam.eps = nan; }, "eps"},
      {[&](TrainOptions& o) { o.adam.weight_decay = nan; }, "weight_decay"},
      {[&](TrainOptions& o) { o.max_grad_norm = nan; }, "max_grad_norm"},
      {[&](TrainOptions& o) { o.masking.eps = nan; }, "masking.eps"},
  };
  for (const auto& [edit, field] : sft) {
    TrainOptions o = guard_sft_options("", 1);
    edit(o);
    auto t = Trainer::create_with_data(o, ctx_, guard_corpus());
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_NE(t.status().message().find("(" + field + "): must be a finite number"), std::string::npos)
        << t.status().message();
  }
  ASSERT_TRUE(fs::exists(fs::path(DC_GRPO_FIXTURES_DIR) / ".complete")) << "run `ctest -R grpo_fixtures` first";
  const std::vector<std::pair<std::function<void(GrpoOptions&)>, std::string>> grpo = {
      {[&](GrpoOptions& o) { o.lr.lr = nan; }, "lr"},
      {[&](GrpoOptions& o) { o.loss.beta = nan; }, "loss.beta"},
      {[&](GrpoOptions& o) { o.loss.epsilon = nan; }, "loss.epsilon"},
      {[&](GrpoOptions& o) { o.ref_mixup_alpha = nan; }, "ref_mixup_alpha"},
      {[&](GrpoOptions& o) { o.warmup_ratio = nan; }, "warmup_ratio"},
  };
  for (const auto& [edit, field] : grpo) {
    GrpoOptions o;
    o.model_dir = kGuardGrpoModel.string(), o.n_prompts = 1, o.group_size = 2, o.grad_accum = 1, o.steps = 2;
    edit(o);
    auto t = GrpoTrainer::create(o, ctx_, nullptr);
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_NE(t.status().message().find("(" + field + "): must be a finite number"), std::string::npos)
        << t.status().message();
  }
}

// Probe finding 6 (SFT): a non-finite loss skips the update (weights and moments unchanged, the step
// counted, a note naming the step and the cause), and kMaxConsecutiveSkips in a row stop the run; in f32
// and in bf16 mixed precision (whose bf16 copies must be kept, not re-laid; f32 where the CPU lacks it).
class TrainGuardSkip : public TrainGuard, public ::testing::WithParamInterface<MatmulPrecision> {};

TEST_P(TrainGuardSkip, NonFiniteLossSkipsTheUpdateThenStopsTheRun) {
  auto ckpt = Checkpoint::open(kGuardSftModel.string());
  ASSERT_TRUE(ckpt.ok());
  auto params = ModelParams::from_checkpoint(*ckpt);
  ASSERT_TRUE(params.ok());
  params->find("model.norm.weight")->data[3] = std::nanf("");  // every logit NaN: the loss is NaN
  auto initial = ModelParams::from_weights(ckpt->config(), params->weights());
  ASSERT_TRUE(initial.ok());
  const test::TempDir tmp("guard_skip");
  TrainOptions o = guard_sft_options(tmp.file("out"), 10);
  o.precision = GetParam();
  auto t = Trainer::create_with_params(o, ctx_, ckpt->config(), std::move(*params), guard_corpus());
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int64_t k = 1; k < kMaxConsecutiveSkips; ++k) {
    auto s = (*t)->step();
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_TRUE(s->skipped);
    EXPECT_EQ(s->step, k);
    EXPECT_NE(s->skip_note.find("train step " + std::to_string(k) + ": update skipped: the loss is nan"),
              std::string::npos) << s->skip_note;
    ASSERT_TRUE(same_values((*t)->params(), *initial)) << "step " << k << " changed the weights";
    for (int64_t i = 0; i < (*t)->optimizer().m().n_values(); ++i)
      ASSERT_EQ((*t)->optimizer().m().data()[i], 0.0f) << "moment " << i;
  }
  EXPECT_EQ((*t)->optimizer().state().skipped_steps, kMaxConsecutiveSkips - 1);
  auto stop = (*t)->step();
  ASSERT_FALSE(stop.ok());
  EXPECT_NE(stop.status().message().find("train step " + std::to_string(kMaxConsecutiveSkips)), std::string::npos)
      << stop.status().message();
  EXPECT_TRUE(same_values((*t)->params(), *initial));
  // metrics.jsonl stays JSON: the NaN loss is null, the step marked skipped.
  std::ifstream metrics(fs::path(o.out_dir) / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    EXPECT_EQ(line.find("nan"), std::string::npos) << line;
    const Json j = Json::parse(line);
    EXPECT_TRUE(j["loss"].is_null()) << line;
    EXPECT_EQ(j["skipped"], true) << line;
  }
  EXPECT_EQ(lines, kMaxConsecutiveSkips);
}

INSTANTIATE_TEST_SUITE_P(Modes, TrainGuardSkip, ::testing::Values(MatmulPrecision::kF32, MatmulPrecision::kBF16),
                         [](const auto& info) { return info.param == MatmulPrecision::kBF16 ? "bf16" : "f32"; });

// The core itself: a non-finite gradient norm skips AdamW; the next finite step is applied and resets
// the count of skips in a row.
TEST_F(TrainGuard, NonFiniteGradientNormSkipsAdamW) {
  auto ckpt = Checkpoint::open(kGuardSftModel.string());
  ASSERT_TRUE(ckpt.ok());
  auto params = ModelParams::from_checkpoint(*ckpt);
  ASSERT_TRUE(params.ok());
  auto initial = ModelParams::from_weights(ckpt->config(), params->weights());
  ASSERT_TRUE(initial.ok());
  OptimizerOptions opt;
  opt.lr.lr = 1e-2, opt.lr.schedule = LrSchedule::kConstant;
  OptimizerCore core = OptimizerCore::start(ckpt->config(), std::move(*params), opt);
  float* g = core.grads().data();
  std::fill_n(g, core.grads().n_values(), 0.01f);
  g[5] = std::numeric_limits<float>::infinity();
  core.begin_step();
  const OptimizerStepStats skipped = core.step(ctx_, nullptr, 1.0);
  EXPECT_TRUE(skipped.skipped);
  EXPECT_EQ(skipped.skip_cause, "the gradient norm is inf");
  EXPECT_EQ(core.consecutive_skips(), 1);
  EXPECT_TRUE(same_values(core.params(), *initial));
  std::fill_n(core.grads().data(), core.grads().n_values(), 0.01f);
  core.begin_step();
  const OptimizerStepStats applied = core.step(ctx_, nullptr, 1.0);
  EXPECT_FALSE(applied.skipped);
  EXPECT_EQ(applied.step, 2);
  EXPECT_EQ(core.consecutive_skips(), 0);
  EXPECT_FALSE(same_values(core.params(), *initial));
}

// A rollout without the sampler: every prompt's G completions of C = 4 ids, rewards from `reward`.
RolloutFn guard_rollout(int64_t G, std::function<double(int64_t row)> reward) {
  return [=](const Context&, const Model&, int64_t, const std::vector<int64_t>& prompts) -> Result<Rollout> {
    Rollout r;
    const int64_t n = static_cast<int64_t>(prompts.size()) * G, C = 4;
    r.batch.n_batch = n, r.batch.n_prompt = 3, r.batch.n_completion = C;
    for (int64_t i = 0; i < n; ++i) {
      r.batch.prompt_ids.insert(r.batch.prompt_ids.end(), {1, 2, 3});
      for (int64_t j = 0; j < C; ++j) r.batch.completion_ids.push_back(static_cast<int32_t>(5 + (i * 3 + j) % 20));
      r.batch.completion_mask.insert(r.batch.completion_mask.end(), C, 1);
      r.rewards.push_back(reward(i));
    }
    return r;
  };
}

GrpoOptions guard_grpo_options(const std::string& out) {
  GrpoOptions o;
  o.model_dir = kGuardGrpoModel.string();
  o.out_dir = out;
  o.n_prompts = 3, o.steps = 2, o.group_size = 4, o.prompts_per_round = 1, o.grad_accum = 1, o.num_iterations = 1;
  o.lr.lr = 1e-3, o.lr.schedule = LrSchedule::kConstant, o.warmup_ratio = 0;
  o.precision = MatmulPrecision::kF32;
  return o;
}

// Probe finding 6 (GRPO): a finite but huge reward (1e39) made the gradient NaN and destroyed the model;
// now the step stops with an error naming the step and the reward, the weights unchanged. A tampered
// cursor of a GRPO checkpoint is refused like SFT's.
TEST_F(TrainGuard, GrpoRefusesAHugeRewardAndATamperedCursor) {
  ASSERT_TRUE(fs::exists(fs::path(DC_GRPO_FIXTURES_DIR) / ".complete")) << "run `ctest -R grpo_fixtures` first";
  const test::TempDir tmp("guard_grpo");
  auto huge = GrpoTrainer::create(guard_grpo_options(""), ctx_, guard_rollout(4, [](int64_t i) {
                                    return i == 2 ? 1e39 : 0.5;
                                  }));
  ASSERT_TRUE(huge.ok()) << huge.status().message();
  auto initial = ModelParams::from_weights((*huge)->optimizer().config(), (*huge)->params().weights());
  ASSERT_TRUE(initial.ok());
  auto s = (*huge)->step();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("GRPO step 1"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("rewards[2] = 1e+39"), std::string::npos) << s.status().message();
  EXPECT_TRUE(same_values((*huge)->params(), *initial));

  const std::string out = tmp.file("out");
  {
    auto t = GrpoTrainer::create(guard_grpo_options(out), ctx_, guard_rollout(4, [](int64_t i) { return i % 2; }));
    ASSERT_TRUE(t.ok()) << t.status().message();
    while ((*t)->steps_done() < 2) ASSERT_TRUE((*t)->step().ok());
    ASSERT_TRUE((*t)->save().ok());
  }
  const fs::path state_path = fs::path(out) / "checkpoint-000002" / "trainer_state.json";
  Json j;
  std::ifstream(state_path) >> j;
  EXPECT_EQ(j["cursor"], 2);  // two rounds of one prompt
  j["cursor"] = -3;
  std::ofstream(state_path) << j.dump();
  GrpoOptions o = guard_grpo_options(out);
  o.resume = true;
  auto resumed = GrpoTrainer::create(o, ctx_, guard_rollout(4, [](int64_t i) { return i % 2; }));
  ASSERT_FALSE(resumed.ok());
  EXPECT_NE(resumed.status().message().find(state_path.string() + ": field 'cursor'"), std::string::npos)
      << resumed.status().message();
}

}  // namespace
}  // namespace dc::train
