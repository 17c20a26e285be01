// LoRA fine-tuning through the Trainer (TrainOptions::lora): over the frozen tiny model the loss falls on the
// code corpus; the checkpoint is a PEFT adapter that reloads to the trainer's adapters bit for bit and, merged
// into the weights, gives the unmerged forward's logits and the engine's unmerged tokens; a killed run resumes bit
// for bit (dropout on, gradient checkpointing on the resume); a q8 base trains (QLoRA); resuming across the full /
// LoRA modes is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "batch_case.h"
#include "engine/engine.h"
#include "lora/adapter.h"
#include "lora/merge.h"
#include "lora/trainable.h"
#include "model/convert.h"
#include "model/transformer.h"
#include "temp_dir.h"
#include "train/tiny_training.h"

namespace dc::train {
namespace {

TrainOptions lora_options(const std::filesystem::path& out, int64_t steps) {
  TrainOptions o = tiny_options(out, steps);
  o.lora.r = 8, o.lora.alpha = 16;
  o.lr.lr = 2e-2;
  return o;
}

double mean_loss(const std::vector<StepStats>& h, size_t from, size_t n) {
  double sum = 0;
  for (size_t i = from; i < from + n; ++i) sum += h[i].loss;
  return sum / static_cast<double>(n);
}

TEST(TrainerLora, LossFallsAndTheCheckpointIsAPeftAdapterOfTheSameModel) {
  ASSERT_TRUE(std::filesystem::exists(kGrad / ".complete")) << "run `ctest -R grad_fixtures` first";
  const test::TempDir tmp("train_lora");
  const std::filesystem::path out = tmp.file("out");
  ThreadPool pool(2);
  TrainOptions o = lora_options(out, 300);
  o.precision = MatmulPrecision::kF32;
  auto t = Trainer::create_with_data(o, make_ctx(pool), code_corpus(32));
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_NE((*t)->lora(), nullptr);
  EXPECT_EQ((*t)->params().n_values(), 0) << "a LoRA run holds no f32 copy of the base";
  while ((*t)->steps_done() < 300) ASSERT_TRUE((*t)->step().ok());
  const auto& h = (*t)->history();
  const double first = mean_loss(h, 0, 20), last = mean_loss(h, h.size() - 20, 20);
  EXPECT_LT(last, 0.85 * first) << "mean loss of the first 20 steps " << first << ", of the last 20 " << last;
  std::printf("[ lora     ] loss %.3f -> %.3f over 300 steps\n", first, last);
  ASSERT_TRUE((*t)->save().ok());
  const std::filesystem::path ckpt = out / "checkpoint-000300";
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"})
    EXPECT_TRUE(std::filesystem::exists(ckpt / f)) << f;
  EXPECT_FALSE(std::filesystem::exists(ckpt / "model.safetensors")) << "the base is not saved";

  // The saved adapter is the trainer's, bit for bit.
  auto base = Model::load((kGrad / "tiny-train").string());
  ASSERT_TRUE(base.ok());
  auto adapter = open_lora_adapter(ckpt.string());
  ASSERT_TRUE(adapter.ok()) << adapter.status().message();
  auto loaded = LoraParams::from_adapter(*adapter, (*base)->config());
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const LoraParams& trained = (*t)->lora()->params();
  ASSERT_EQ(loaded->n_values(), trained.n_values());
  EXPECT_EQ(0, std::memcmp(loaded->data(), trained.data(), trained.n_values() * sizeof(float)));

  // Merged into the weights (the engine's default --lora), the same logits as the unmerged forward.
  const Context ctx = make_ctx(pool);
  const int64_t L = 32, V = (*base)->config().n_vocab;
  const std::vector<int32_t> corpus = code_corpus(32).sequences[3].tokens;
  BatchCase k = every_position(1, L, [&](int64_t i) { return corpus[i]; });
  k.tokens[20] = k.tokens[21] = static_cast<int32_t>((*base)->config().mask_token_id);
  ForwardBatch fb = k.view();
  std::vector<float> unmerged(L * V), merged_logits(L * V), plain(L * V);
  fb.lora = &trained.weights();
  ASSERT_TRUE((*base)->forward(ctx, fb, unmerged.data()).ok());
  fb.lora = nullptr;
  ASSERT_TRUE((*base)->forward(ctx, fb, plain.data()).ok());
  auto merged = load_lora_merged(std::move(*base), ckpt.string(), &pool);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  ASSERT_TRUE((*merged)->forward(ctx, fb, merged_logits.data()).ok());
  double worst = 0, largest = 0, moved = 0;
  for (int64_t i = 0; i < L * V; ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(unmerged[i] - merged_logits[i])));
    largest = std::max(largest, static_cast<double>(std::fabs(merged_logits[i])));
    moved = std::max(moved, static_cast<double>(std::fabs(plain[i] - merged_logits[i])));
  }
  EXPECT_LE(worst, 1e-5 * largest);
  EXPECT_GT(moved, 1e-2 * largest) << "training did not change the model";

  // The engine generates the same tokens with the trained adapter merged (the default) and unmerged.
  std::vector<std::vector<int32_t>> generated;
  for (const LoraMode mode : {LoraMode::kMerged, LoraMode::kUnmerged}) {
    EngineOptions eo;
    eo.model_dir = (kGrad / "tiny-train").string(), eo.lora_dir = ckpt.string(), eo.lora_mode = mode;
    eo.n_threads = 2, eo.matmul_precision = MatmulPrecision::kF32, eo.weight_cache = "off";
    auto engine = Engine::load(eo);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    SamplingParams sp = (*engine)->default_params();
    sp.max_new_tokens = 12, sp.steps = 12, sp.temperature = 0.0f;
    auto out = (*engine)->generate({{k.tokens[0], k.tokens[1], k.tokens[2], k.tokens[3]}}, sp);
    ASSERT_TRUE(out.ok()) << out.status().message();
    generated.push_back(out->generated[0]);
  }
  EXPECT_EQ(generated[0], generated[1]);
}

TEST(TrainerLora, KilledRunResumesBitForBitAndModesDoNotMix) {
  ASSERT_TRUE(std::filesystem::exists(kGrad / ".complete")) << "run `ctest -R grad_fixtures` first";
  ThreadPool pool(2);
  const test::TempDir tmp("train_lora_resume");
  const std::filesystem::path whole = tmp.file("whole"), cut = tmp.file("cut");
  TrainOptions o = lora_options(whole, 7);
  o.lora.dropout = 0.1f;
  o.grad_accum = 2, o.save_every = 3, o.max_grad_norm = 0.5, o.adam.weight_decay = 0.1;
  const std::unique_ptr<Trainer> a = trained_to(o, pool, 7);
  ASSERT_NE(a, nullptr);
  o.out_dir = cut.string();
  ASSERT_NE(trained_to(o, pool, 4), nullptr);  // killed after step 4: the checkpoint of step 3 is the newest
  TrainOptions full = o;  // a full fine-tune cannot continue a LoRA run, nor another rank
  full.resume = true, full.lora = LoraSpec{};
  auto refused = Trainer::create_with_data(full, make_ctx(pool), code_corpus(32));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("LoRA"), std::string::npos) << refused.status().message();
  TrainOptions other_rank = o;
  other_rank.resume = true, other_rank.lora.r = 4;
  auto differs = Trainer::create_with_data(other_rank, make_ctx(pool), code_corpus(32));
  ASSERT_FALSE(differs.ok());
  EXPECT_NE(differs.status().message().find("lora_r"), std::string::npos) << differs.status().message();

  o.resume = true;
  o.recompute = true;
  auto c = Trainer::create_with_data(o, make_ctx(pool), code_corpus(32));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ((*c)->steps_done(), 3);
  while ((*c)->steps_done() < 7) ASSERT_TRUE((*c)->step().ok());
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ((*c)->history()[i].loss, a->history()[i].loss) << "step " << i + 1;
  const LoraCore& pa = *a->lora();
  const LoraCore& pc = *(*c)->lora();
  ASSERT_EQ(pa.params().n_values(), pc.params().n_values());
  EXPECT_EQ(0, std::memcmp(pa.params().data(), pc.params().data(), pa.params().n_values() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(pa.m().data(), pc.m().data(), pa.m().n_values() * sizeof(float)));

  // A full fine-tune's checkpoint is refused by a LoRA run.
  const std::filesystem::path full_out = tmp.file("full");
  TrainOptions f = tiny_options(full_out, 1);
  {
    auto ft = Trainer::create_with_data(f, make_ctx(pool), code_corpus(32));
    ASSERT_TRUE(ft.ok());
    ASSERT_TRUE((*ft)->step().ok());
    ASSERT_TRUE((*ft)->save().ok());
  }
  TrainOptions onto_full = lora_options(full_out, 2);
  onto_full.resume = true;
  auto mixed = Trainer::create_with_data(onto_full, make_ctx(pool), code_corpus(32));
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("full fine-tune"), std::string::npos) << mixed.status().message();
}

// QLoRA: the base converted to q8 and to q4 (its matmuls read the codes), the adapters trained through it.
TEST(TrainerLora, TrainsOverAQuantizedBase) {
  ASSERT_TRUE(std::filesystem::exists(kGrad / ".complete")) << "run `ctest -R grad_fixtures` first";
  ThreadPool pool(2);
  const test::TempDir tmp("train_qlora");
  for (const WeightQuant format : {WeightQuant::kQ8, WeightQuant::kQ4}) {
    const std::string name = format == WeightQuant::kQ8 ? "q8" : "q4";
    SCOPED_TRACE(name);
    ConvertOptions convert;
    convert.model_dir = (kGrad / "tiny-train").string();
    convert.out_dir = tmp.file(name);
    convert.quantize.format = format;
    convert.quantize.group_size = 32;  // the tiny model's 32-wide rows
    ASSERT_TRUE(convert_checkpoint(convert, &pool).ok());
    TrainOptions o = lora_options(tmp.file(name + "-out"), 120);
    o.model_dir = convert.out_dir;
    auto t = Trainer::create_with_data(o, make_ctx(pool), code_corpus(32));
    ASSERT_TRUE(t.ok()) << t.status().message();
    while ((*t)->steps_done() < 120) ASSERT_TRUE((*t)->step().ok());
    const auto& h = (*t)->history();
    const double first = mean_loss(h, 0, 20), last = mean_loss(h, h.size() - 20, 20);
    EXPECT_LT(last, 0.9 * first) << first << " -> " << last;
    ASSERT_TRUE((*t)->save().ok());
  }
}

}  // namespace
}  // namespace dc::train
