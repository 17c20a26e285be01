// The facade's Trainer settings that `diffucoder train` maps its flags onto (loss_norm, AdamW's betas and
// eps, t_eps, pad_token_id, save_every, ranks) and the accessors of its messages: each bad value refused
// naming the field, each setting changing the run as train::TrainOptions' field does.
#include <gtest/gtest.h>

#include <diffucoder/diffucoder.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "fixtures.h"
#include "temp_dir.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using dc::testing::fixtures_dir;

// Six {"prompt", "completion"} lines of different answer lengths (so the two loss_norm differ).
std::string write_data(const fs::path& dir) {
  std::ofstream data(dir / "sft.jsonl");
  for (int i = 0; i < 6; ++i)
    data << R"({"prompt": "def f)" << i << R"((x):", "completion": "\n    return x)" << std::string(i * 3, '+')
         << " " << i << "\"}\n";
  return (dir / "sft.jsonl").string();
}

diffucoder::TrainConfig small_config(const std::string& data) {
  diffucoder::TrainConfig c;
  c.model_dir = fixtures_dir() + "/tiny-vocab";
  c.data_path = data;
  c.instruct_template = true;
  c.seq_len = 48, c.batch_size = 2, c.steps = 2, c.lr = 1e-3, c.threads = 2, c.precision = "f32";
  return c;
}

std::vector<double> losses(diffucoder::TrainConfig c) {
  auto t = diffucoder::Trainer::create(c);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  std::vector<double> out;
  while ((*t)->steps_done() < c.steps) {
    auto s = (*t)->step();
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) break;
    out.push_back(s->loss);
  }
  return out;
}

TEST(ApiTrainer, NewSettingsRefusedNamingTheField) {
  const dc::test::TempDir tmp("api_train_fields");
  const diffucoder::TrainConfig c = small_config(write_data(tmp.path()));
  auto refused = [&](const diffucoder::TrainConfig& bad, const std::string& field) {
    auto t = diffucoder::Trainer::create(bad);
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_EQ(t.status().code(), diffucoder::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(t.status().message().rfind(field + ":", 0), 0u) << t.status().message();
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  diffucoder::TrainConfig bad = c;
  bad.loss_norm = "mean";
  refused(bad, "loss_norm");
  bad = c, bad.beta1 = 1.0;  // 1 − β^t = 0 in the bias correction
  refused(bad, "beta1");
  bad = c, bad.beta2 = -0.5;
  refused(bad, "beta2");
  bad = c, bad.beta2 = nan;
  refused(bad, "beta2");
  bad = c, bad.adam_eps = 0;
  refused(bad, "adam_eps");
  bad = c, bad.adam_eps = std::numeric_limits<double>::infinity();
  refused(bad, "adam_eps");
  bad = c, bad.t_eps = 1.0;
  refused(bad, "t_eps");
  bad = c, bad.t_eps = 0;
  refused(bad, "t_eps");
  bad = c, bad.save_every = -1;
  refused(bad, "save_every");
  bad = c, bad.lr = -1e-3;
  refused(bad, "lr");
  bad = c, bad.min_lr_ratio = 1.5;
  refused(bad, "min_lr_ratio");
  bad = c, bad.weight_decay = nan;
  refused(bad, "weight_decay");
  bad = c, bad.max_grad_norm = -1;
  refused(bad, "max_grad_norm");
  bad = c, bad.warmup_steps = -2;
  refused(bad, "warmup_steps");
}

// Each new setting reaches train::TrainOptions: the facade's losses equal the library trainer's given
// the same options bit for bit, and differ from the defaults'.
TEST(ApiTrainer, NewSettingsChangeTheRunAsTheLibrarysOptions) {
  const dc::test::TempDir tmp("api_train_settings");
  diffucoder::TrainConfig c = small_config(write_data(tmp.path()));
  const std::vector<double> plain = losses(c);
  c.loss_norm = "sequences", c.t_eps = 0.3, c.beta1 = 0.5, c.beta2 = 0.9, c.adam_eps = 1e-4;
  const std::vector<double> changed = losses(c);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(changed.size(), 2u);
  EXPECT_NE(plain[0], changed[0]);  // loss_norm and t_eps change the first step's loss
  EXPECT_NE(plain[1], changed[1]);

  dc::train::TrainOptions o;
  o.model_dir = c.model_dir, o.data_path = c.data_path, o.instruct_template = true;
  o.seq_len = 48, o.batch_size = 2, o.steps = 2, o.lr.lr = 1e-3, o.lr.total_steps = 2;
  o.precision = dc::MatmulPrecision::kF32;
  o.masking.norm = dc::train::LossNorm::kSequences, o.masking.eps = 0.3;
  o.adam.beta1 = 0.5, o.adam.beta2 = 0.9, o.adam.eps = 1e-4;
  dc::ThreadPool pool(2);
  dc::Context ctx;
  ctx.pool = &pool;
  auto library = dc::train::Trainer::create(o, ctx);
  ASSERT_TRUE(library.ok()) << library.status().to_string();
  for (size_t i = 0; i < changed.size(); ++i) {
    auto s = (*library)->step();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->loss, changed[i]) << "step " << i + 1;
  }

  // pad_token_id: the canvas fill (the positions past the answer are scored as pad), so the loss moves.
  diffucoder::TrainConfig pad = small_config(c.data_path);
  pad.pad_token_id = 5;
  const std::vector<double> padded = losses(pad);
  ASSERT_EQ(padded.size(), 2u);
  EXPECT_NE(padded[0], plain[0]);
}

// save_every writes checkpoints inside step(); the accessors `diffucoder train` prints from; a single
// process's Ranks; resume's note and history.
TEST(ApiTrainer, SaveEveryAccessorsRanksAndResume) {
  const dc::test::TempDir tmp("api_train_resume");
  diffucoder::TrainConfig c = small_config(write_data(tmp.path()));
  c.out_dir = (fs::path(tmp.path()) / "out").string();
  c.save_every = 1;

  auto ranks = diffucoder::Ranks::join(30);
  ASSERT_TRUE(ranks.ok()) << ranks.status().to_string();
  EXPECT_EQ((*ranks)->size(), 1);
  EXPECT_EQ((*ranks)->rank(), 0);
  EXPECT_EQ((*ranks)->backend(), "single");
  EXPECT_TRUE((*ranks)->check_same_settings({{"--lr", "0.001"}}).ok());
  EXPECT_TRUE((*ranks)->barrier().ok());
  c.ranks = ranks->get();
  {
    auto t = diffucoder::Trainer::create(c);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const diffucoder::TrainDataCounts data = (*t)->data_counts();
    EXPECT_EQ(data.sequences, 6);
    EXPECT_EQ(data.skipped, 0);
    EXPECT_EQ((*t)->resume_note(), "");
    auto s = (*t)->step();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_GT(s->loss_rows, 0);
    EXPECT_FALSE(s->skipped);
    EXPECT_TRUE(fs::exists(fs::path(tmp.path()) / "out" / "checkpoint-000001" / "model.safetensors")) << "save_every 1";
    ASSERT_TRUE((*t)->step().ok());
    EXPECT_FALSE(fs::exists(fs::path(tmp.path()) / "out" / "checkpoint-000002")) << "the last step: save()'s";
    ASSERT_TRUE((*t)->save().ok());
    EXPECT_TRUE(fs::exists(fs::path(tmp.path()) / "out" / "checkpoint-000002" / "model.safetensors"));
    EXPECT_EQ((*t)->skipped_steps(), 0);
    ASSERT_EQ((*t)->history().size(), 2u);
    EXPECT_EQ((*t)->history()[1].step, 2);
    auto stats = (*t)->gather_rank_stats();
    ASSERT_TRUE(stats.ok()) << stats.status().to_string();
    ASSERT_EQ(stats->size(), 1u);
    EXPECT_GT((*stats)[0].peak_rss_bytes, 0);
    EXPECT_GT((*stats)[0].master_weight_bytes, 0);
    EXPECT_GT((*stats)[0].optimizer_state_bytes, 0);
    EXPECT_EQ((*stats)[0].bytes_sent_per_step, 0.0);
  }
  c.resume = true, c.steps = 3;  // raised: the schedule is stretched, and the trainer says so
  auto resumed = diffucoder::Trainer::create(c);
  ASSERT_TRUE(resumed.ok()) << resumed.status().to_string();
  EXPECT_EQ((*resumed)->steps_done(), 2);
  EXPECT_NE((*resumed)->resume_note(), "");
  ASSERT_EQ((*resumed)->history().size(), 2u) << "the steps of metrics.jsonl";
  auto third = (*resumed)->step();
  ASSERT_TRUE(third.ok()) << third.status().to_string();
  EXPECT_EQ(third->step, 3);
  EXPECT_EQ((*resumed)->history().size(), 3u);
}

}  // namespace
