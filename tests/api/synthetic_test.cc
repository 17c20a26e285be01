// The facade's benchmarking aids (src/api/synthetic.cc, the ForwardEvent of api.cc, train.cc's random
// sequences and fixed mask ratio): what `diffucoder bench` runs on. A synthetic Model equals the model
// layer's synthetic model; each step's forward is reported with its size; a synthetic Trainer steps as the
// library trainer over the same weights and data, bit for bit; each bad field is refused by name.
#include <gtest/gtest.h>

#include <diffucoder/diffucoder.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "train/trainer.h"

namespace {

diffucoder::SyntheticModel tiny(int64_t layers = 1, int64_t vocab = 64, const std::string& weights = "bf16") {
  return diffucoder::SyntheticModel{"tiny", layers, vocab, weights, 128, 7};
}

diffucoder::LoadOptions synthetic_options(const diffucoder::SyntheticModel& s) {
  diffucoder::LoadOptions o;
  o.threads = 2;
  o.precision = "f32";
  o.synthetic = s;
  return o;
}

std::vector<std::vector<int32_t>> two_prompts() { return {{1, 2, 3, 4, 5}, {9, 8, 7, 6, 5}}; }

diffucoder::GenerationConfig greedy(const diffucoder::Model& m, int64_t new_tokens, int steps) {
  diffucoder::GenerationConfig c = m.default_config();
  c.max_new_tokens = new_tokens, c.steps = steps, c.alg = "entropy", c.temperature = 0;
  return c;
}

// A synthetic Model generates what an engine over the model layer's synthetic model of the same shape and
// seed generates; its info has the shape's dimensions.
TEST(ApiSynthetic, ModelEqualsTheModelLayersSyntheticModel) {
  for (const std::string weights : {"bf16", "q8"}) {
    auto model = diffucoder::Model::load(synthetic_options(tiny(1, 64, weights)));
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    const diffucoder::ModelInfo& info = (*model)->info();
    auto config = dc::synthetic_config("tiny");
    ASSERT_TRUE(config.ok());
    EXPECT_EQ(info.n_layer, 1);
    EXPECT_EQ(info.n_vocab, 64);
    EXPECT_EQ(info.mask_token_id, 62);
    EXPECT_EQ(info.hidden_size, config->n_embd);
    EXPECT_EQ(info.head_dim, config->head_dim);
    EXPECT_EQ(info.intermediate_size, config->n_ff);
    EXPECT_EQ(info.threads, 2);
    EXPECT_EQ(info.device, "cpu");
    EXPECT_EQ((*model)->tokenizer(), nullptr);

    config->n_layer = 1, config->n_vocab = 64, config->mask_token_id = 62;
    config->pad_token_id = config->eos_token_id = config->bos_token_id = 63;
    dc::ThreadPool pool(2);
    dc::QuantizeOptions q;
    auto layer_model = dc::make_synthetic_model(*config, 7, &pool, weights == "q8" ? &q : nullptr);
    ASSERT_TRUE(layer_model.ok());
    auto engine = dc::Engine::from_model(std::move(*layer_model), 2);
    ASSERT_TRUE(engine->set_matmul_precision(dc::MatmulPrecision::kF32).ok());
    dc::SamplingParams p = engine->default_params();
    p.max_new_tokens = 8, p.steps = 8, p.alg = dc::Algorithm::kEntropy, p.temperature = 0;
    auto want = engine->generate(two_prompts(), p);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    auto got = (*model)->generate(two_prompts(), greedy(**model, 8, 8));
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(got->generated(r), want->generated[r]) << weights << " row " << r;
  }
}

// Every step that runs a forward reports it: without a cache the whole canvas, with the dual cache and blocks
// the window (fewer positions); as many forwards as Generation::forwards, timed within the generation.
TEST(ApiSynthetic, StepEventsReportEachForwardWithItsSize) {
  auto model = diffucoder::Model::load(synthetic_options(tiny()));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (const std::string cache : {"none", "dual"}) {
    diffucoder::GenerationConfig c = greedy(**model, 16, 8);
    if (cache == "dual") c.cache = "dual", c.block_length = 8;
    std::vector<diffucoder::ForwardEvent> forwards;
    int steps = 0;
    diffucoder::Hooks hooks;
    hooks.on_step = [&](const diffucoder::StepEvent& s) {
      ++steps;
      if (s.forward) {
        EXPECT_EQ(s.forward->keys, s.n_seq);
        forwards.push_back(*s.forward);
      }
      return true;
    };
    auto out = (*model)->generate(two_prompts(), c, hooks);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(steps, out->steps_run);
    ASSERT_EQ(static_cast<int>(forwards.size()), out->forwards) << cache;
    double seconds = 0, last_end = 0;
    int64_t window_forwards = 0;
    for (const diffucoder::ForwardEvent& f : forwards) {
      EXPECT_GT(f.seconds, 0.0);
      EXPECT_GE(f.ended_at, last_end);
      EXPECT_GE(f.ended_at, f.seconds);
      last_end = f.ended_at;
      seconds += f.seconds;
      EXPECT_LE(f.positions, out->n_rows * out->n_seq);
      window_forwards += f.positions < out->n_rows * out->n_seq;
    }
    EXPECT_LE(seconds * 1e3, out->total_ms + 1.0);
    if (cache == "none") EXPECT_EQ(window_forwards, 0);
    else EXPECT_GT(window_forwards, 0);  // the dual cache computes only the block's window between refreshes
  }
  // Without an on_step hook no forward is timed, and nothing changes.
  auto plain = (*model)->generate(two_prompts(), greedy(**model, 16, 8));
  ASSERT_TRUE(plain.ok());
  // LoadOptions::max_kv_cache_bytes holds for a synthetic model too: a KV cache over it is refused.
  diffucoder::LoadOptions small_cache = synthetic_options(tiny());
  small_cache.max_kv_cache_bytes = 1024;
  auto capped = diffucoder::Model::load(small_cache);
  ASSERT_TRUE(capped.ok()) << capped.status().to_string();
  diffucoder::GenerationConfig dual = greedy(**capped, 16, 8);
  dual.cache = "dual", dual.block_length = 8;
  auto refused = (*capped)->generate(two_prompts(), dual);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), diffucoder::StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("max_kv_cache_bytes"), std::string::npos) << refused.status().message();
  EXPECT_TRUE((*model)->generate(two_prompts(), dual).ok());
}

TEST(ApiSynthetic, ResolveFastFillsOnlyWhatIsLeftOff) {
  diffucoder::GenerationConfig c;
  c.fast = true;
  auto r = diffucoder::resolve_fast(c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->fast);
  EXPECT_EQ(r->block_length, 32);
  EXPECT_EQ(r->cache, "dual");
  EXPECT_FLOAT_EQ(r->threshold, 0.9f);
  EXPECT_FALSE(r->mask_token_id.has_value());
  c.block_length = 8, c.cache = "prefix", c.factor = 1.5f, c.mask_token_id = 5;
  r = diffucoder::resolve_fast(c);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->block_length, 8);
  EXPECT_EQ(r->cache, "prefix");
  EXPECT_EQ(r->threshold, 0.0f);
  EXPECT_EQ(r->factor, 1.5f);
  EXPECT_EQ(r->mask_token_id, 5);
  c.fast = false, c.cache = "nope";
  EXPECT_TRUE(diffucoder::resolve_fast(c).ok());  // without fast: as given (generate() checks it)
  c.fast = true;
  auto bad = diffucoder::resolve_fast(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("nope"), std::string::npos) << bad.status().message();
}

TEST(ApiSynthetic, LoadRefusesBadFieldsByName) {
  auto refused = [](diffucoder::LoadOptions o, const std::string& field) {
    auto m = diffucoder::Model::load(o);
    ASSERT_FALSE(m.ok()) << field;
    EXPECT_EQ(m.status().code(), diffucoder::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(m.status().message().find(field), std::string::npos) << m.status().message();
  };
  refused(synthetic_options(tiny(0, 8)), "synthetic.vocab");
  refused(synthetic_options(tiny(2000, 0)), "synthetic.layers");
  refused(synthetic_options(tiny(1, 64, "q3")), "synthetic.weights");
  refused(synthetic_options(diffucoder::SyntheticModel{"huge"}), "'huge'");
  diffucoder::SyntheticModel q4 = tiny(1, 64, "q4");
  q4.group_size = 33;
  refused(synthetic_options(q4), "33");
  diffucoder::LoadOptions both = synthetic_options(tiny());
  both.model_dir = "/some/checkpoint";
  refused(both, "synthetic");
  diffucoder::LoadOptions lora = synthetic_options(tiny());
  lora.lora_dir = "/some/adapter";
  refused(lora, "lora_dir");
}

diffucoder::TrainConfig synthetic_train(int64_t lora_r = 0, const std::string& weights = "bf16") {
  diffucoder::TrainConfig c;
  c.synthetic = tiny(1, 64, weights);
  c.seq_len = 24, c.batch_size = 2, c.steps = 2, c.lr = 1e-3, c.threads = 2, c.precision = "f32";
  c.lr_schedule = "constant", c.seed = 5;
  c.random_sequences = 4, c.random_prompt_len = 6, c.mask_ratio = 0.5;
  c.lora_r = lora_r;
  return c;
}

// The library's trainer as bench --train built it before the facade had these fields: the model layer's
// synthetic weights widened to f32, random sequences from std::mt19937(seed) (ids below n_vocab, never the mask
// id; the prompt never masked) and the fixed t.
std::unique_ptr<dc::train::Trainer> library_trainer(const diffucoder::TrainConfig& c, dc::Context ctx) {
  auto config = dc::synthetic_config("tiny");
  EXPECT_TRUE(config.ok());
  config->n_layer = 1, config->n_vocab = 64, config->mask_token_id = 62;
  config->pad_token_id = config->eos_token_id = config->bos_token_id = 63;
  std::mt19937 gen(static_cast<uint32_t>(c.seed));
  std::uniform_int_distribution<int32_t> id(0, 63);
  dc::train::Dataset data;
  data.sequences.resize(4);
  for (dc::train::TrainSequence& s : data.sequences) {
    s.tokens.resize(c.seq_len);
    for (int32_t& t : s.tokens) {
      do t = id(gen); while (t == 62);
    }
    s.loss_mask.assign(c.seq_len, 1);
    std::fill_n(s.loss_mask.begin(), c.random_prompt_len, uint8_t{0});
  }
  dc::train::TrainOptions o;
  o.seq_len = c.seq_len, o.batch_size = c.batch_size, o.steps = c.steps, o.seed = c.seed;
  o.lr.schedule = dc::train::LrSchedule::kConstant, o.lr.lr = c.lr;
  o.masking.fixed_t.assign(c.batch_size, c.mask_ratio);
  o.precision = dc::MatmulPrecision::kF32;
  auto model = dc::make_synthetic_model(*config, 7, ctx.pool);
  EXPECT_TRUE(model.ok());
  auto params = dc::ModelParams::from_weights(*config, (*model)->weights());
  EXPECT_TRUE(params.ok());
  auto t = dc::train::Trainer::create_with_params(o, ctx, *config, std::move(*params), std::move(data));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(ApiSynthetic, TrainerStepsAsTheLibraryTrainerOverTheSameWeightsAndData) {
  const diffucoder::TrainConfig c = synthetic_train();
  auto facade = diffucoder::Trainer::create(c);
  ASSERT_TRUE(facade.ok()) << facade.status().to_string();
  dc::ThreadPool pool(2);
  dc::Context ctx;
  ctx.pool = &pool;
  auto library = library_trainer(c, ctx);
  ASSERT_NE(library, nullptr);
  EXPECT_EQ((*facade)->info().n_layer, 1);
  EXPECT_EQ((*facade)->info().n_vocab, 64);
  EXPECT_EQ((*facade)->info().threads, 2);
  EXPECT_EQ((*facade)->parameters(), library->params().n_values());
  EXPECT_EQ((*facade)->trainable_values(), (*facade)->parameters());
  for (int step = 0; step < 2; ++step) {
    auto a = (*facade)->step();
    auto b = library->step();
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(a->loss, b->loss) << "step " << step;
    EXPECT_EQ(a->grad_norm, b->grad_norm) << "step " << step;
    EXPECT_EQ(a->loss_rows, b->loss_rows) << "step " << step;
    // The phases: parts of the step, the forward and backward of forward_backward_seconds.
    EXPECT_GT(a->forward_seconds, 0.0);
    EXPECT_GT(a->backward_seconds, 0.0);
    EXPECT_GT(a->optimizer_seconds, 0.0);
    EXPECT_LE(a->forward_seconds + a->backward_seconds, a->forward_backward_seconds + 1e-9);
    EXPECT_GE(a->masking_seconds, 0.0);
    EXPECT_NEAR(a->masking_seconds + a->forward_backward_seconds + a->optimizer_seconds, a->seconds, 1e-9);
  }
  // The fixed ratio takes effect: t = 0.5 masks fewer completion positions than t = 1.
  diffucoder::TrainConfig all = c;
  all.mask_ratio = 1.0;
  auto full = diffucoder::Trainer::create(all);
  ASSERT_TRUE(full.ok());
  auto s = (*full)->step();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->loss_rows, c.batch_size * (c.seq_len - c.random_prompt_len));
  // A LoRA run over a q8 base trains only the adapters.
  auto lora = diffucoder::Trainer::create(synthetic_train(4, "q8"));
  ASSERT_TRUE(lora.ok()) << lora.status().to_string();
  EXPECT_EQ((*lora)->parameters(), (*facade)->parameters());
  EXPECT_GT((*lora)->trainable_values(), 0);
  EXPECT_LT((*lora)->trainable_values(), (*lora)->parameters());
  auto ls = (*lora)->step();
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  EXPECT_TRUE(std::isfinite(ls->loss));
}

TEST(ApiSynthetic, TrainerRefusesBadBenchmarkFieldsByName) {
  auto refused = [](const diffucoder::TrainConfig& bad, const std::string& field) {
    auto t = diffucoder::Trainer::create(bad);
    ASSERT_FALSE(t.ok()) << field;
    EXPECT_EQ(t.status().code(), diffucoder::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(t.status().message().rfind(field, 0), 0u) << t.status().message();
  };
  const diffucoder::TrainConfig c = synthetic_train();
  diffucoder::TrainConfig bad = c;
  bad.mask_ratio = 1.5;
  refused(bad, "mask_ratio");
  bad = c, bad.mask_ratio = -0.1;
  refused(bad, "mask_ratio");
  bad = c, bad.random_prompt_len = c.seq_len;
  refused(bad, "random_prompt_len");
  bad = c, bad.random_sequences = -1;
  refused(bad, "random_sequences");
  bad = c, bad.data_path = "sft.jsonl";
  refused(bad, "random_sequences");
  bad = c, bad.random_sequences = 0;
  refused(bad, "synthetic");
  bad = c, bad.model_dir = "/some/checkpoint";
  refused(bad, "synthetic");
  bad = c, bad.out_dir = "/tmp/out";
  refused(bad, "synthetic");
  bad = c, bad.synthetic->weights = "q4";  // quantized weights only as a frozen LoRA base
  refused(bad, "synthetic.weights");
  bad = c, bad.synthetic->vocab = 8;
  refused(bad, "synthetic.vocab");
}

}  // namespace
