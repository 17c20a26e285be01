// Cache committed (dKV-Cache's delayed caching inside Fast-dLLM's dual window) on a tiny model trained on
// code (tests/train/tiny_training.h: the trainer test's run, loss 6.9 → 2.4 nats), whose distributions are
// peaked as a real model's are and a random fixture's are not: refresh_every 1 is dual token for token, the other intervals compute
// fewer positions, and their agreement with dual (and dual's with cache none) is printed for docs/generate.md.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/engine.h"
#include "model/transformer.h"
#include "train/tiny_training.h"

namespace dc::train {
namespace {

namespace fs = std::filesystem;

// One generation per prompt (as single requests; in a batch each row would draw from streams of its row
// index): the generated tokens of every prompt, and the positions computed in all.
struct Runs {
  std::vector<std::vector<int32_t>> generated;
  int64_t positions = 0;
};

// The fraction of generated tokens of `a` equal to `b`'s at the same prompt and position.
double agreement(const Runs& a, const Runs& b) {
  int64_t same = 0, all = 0;
  for (size_t r = 0; r < a.generated.size(); ++r)
    for (size_t i = 0; i < a.generated[r].size(); ++i) {
      ++all;
      same += a.generated[r][i] == b.generated[r][i];
    }
  return static_cast<double>(same) / static_cast<double>(all);
}

TEST(CommittedCache, AgreesWithDualOnATinyTrainedModel) {
  ASSERT_TRUE(fs::exists(kGrad / ".complete")) << "run `ctest -R grad_fixtures` first";
  ThreadPool pool(2);
  TrainOptions o = tiny_options(fs::path(), 600);
  o.out_dir.clear();
  const std::unique_ptr<Trainer> trained = trained_to(o, pool, 600);
  ASSERT_NE(trained, nullptr);
  const std::unique_ptr<Model> model = Model::from_weights(trained->config(), trained->params().weights(), nullptr);
  const Context ctx{Device::kCpu, &pool};
  // Prompts: the openings of 16 corpus sequences, every other one 4 tokens shorter.
  const Dataset corpus = code_corpus(32);
  ASSERT_GE(corpus.sequences.size(), 16u * 9u);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < 16; ++i) {
    const std::vector<int32_t>& t = corpus.sequences[i * 9].tokens;
    prompts.emplace_back(t.begin(), t.begin() + (i % 2 == 0 ? 16 : 12));
  }
  for (float threshold : {0.0f, 0.5f}) {
    SamplingParams p;
    p.max_new_tokens = 32, p.steps = 32, p.block_length = 8, p.threshold = threshold;
    // Sampled at temperature 1 (greedy decoding of this character model is mostly runs of spaces, on which
    // every mode agrees): the draws are a function of (seed, step, row, position), so a token differs only
    // where the cache moved the distribution or the order of commits.
    p.alg = Algorithm::kEntropy, p.temperature = 1.0f, p.top_k = 0, p.seed = 7;
    p.mask_token_id = 62, p.pad_token_id = 63;
    auto run = [&](CacheMode cache, int every) {
      p.cache = cache, p.refresh_every = every;
      Runs runs;
      for (const std::vector<int32_t>& prompt : prompts) {
        Result<GenerateOutput> out = generate_on_model(*model, ctx, int64_t{1} << 30, {prompt}, p);
        EXPECT_TRUE(out.ok()) << out.status().to_string();
        if (!out.ok()) return Runs{};
        runs.generated.push_back(out->generated[0]);
        runs.positions += out->timings.positions_computed;
      }
      return runs;
    };
    const Runs none = run(CacheMode::kNone, 1), dual = run(CacheMode::kDual, 1);
    ASSERT_EQ(dual.generated.size(), prompts.size());
    std::printf("  threshold %.1f: dual agrees with cache none on %.1f%% of the tokens (%ld positions computed)\n",
                threshold, 100 * agreement(dual, none), static_cast<long>(dual.positions));
    const Runs same = run(CacheMode::kCommitted, 1);
    EXPECT_EQ(same.generated, dual.generated) << "threshold " << threshold;
    EXPECT_EQ(same.positions, dual.positions);
    for (int every : {2, 4, 1000}) {
      const Runs committed = run(CacheMode::kCommitted, every);
      ASSERT_EQ(committed.generated.size(), prompts.size());
      std::printf("  threshold %.1f, committed refresh every %4d: agrees with dual on %.1f%%, with none on %.1f%% "
                  "(%ld positions computed, %.2fx fewer than dual)\n",
                  threshold, every, 100 * agreement(committed, dual), 100 * agreement(committed, none),
                  static_cast<long>(committed.positions),
                  static_cast<double>(dual.positions) / static_cast<double>(committed.positions));
      EXPECT_LT(committed.positions, dual.positions) << "refresh every " << every;
    }
  }
}

}  // namespace
}  // namespace dc::train
