// generate() with fake models: the schedule through the loop, tie order, the logits shift and the
// requested rows, left padding, num_return_sequences, seeds, threads, origin, and a dense independent
// re-implementation of the greedy loop for the confidence-based algorithms.
#include "sampler/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/thread_pool.h"
#include "sampler/fake_model.h"
#include "sampler/schedule.h"

namespace dc {
namespace {

using testing::FakeModel;
using testing::hash_unit;

using testing::kMask;
using testing::kPad;
using testing::kVocab;

SamplingParams small_params(int64_t new_tokens, int steps) {
  SamplingParams p;
  p.max_new_tokens = new_tokens;
  p.steps = steps;
  p.mask_token_id = kMask;
  p.pad_token_id = kPad;
  return p;
}

// Every row: logit `height` on `token`, 0 elsewhere.
testing::RowFn peak(int32_t token, float height = 10.0f) {
  return [=](const ForwardBatch&, int64_t, int64_t, float* logits) {
    std::fill(logits, logits + kVocab, 0.0f);
    logits[token] = height;
  };
}

// Pseudo-random logits that depend on the row's committed tokens, so the unmasking order matters.
float canvas_logit(const int32_t* row, int64_t n_seq, int64_t b, int64_t i, int64_t v) {
  uint64_t s = 0;
  for (int64_t j = 0; j < n_seq; ++j) s = s * 31 + static_cast<uint64_t>(row[j] == kMask ? 0 : row[j] + 1);
  float x = 3.0f * hash_unit(static_cast<uint64_t>(b * 1000 + i), static_cast<uint64_t>(v), s);
  if (v == kMask || v == kPad) x -= 100.0f;  // keep the fake from predicting special ids
  return x;
}

testing::RowFn canvas_model() {
  return [](const ForwardBatch& batch, int64_t b, int64_t i, float* logits) {
    const int32_t* row = batch.tokens + b * batch.n_seq;
    for (int64_t v = 0; v < kVocab; ++v) logits[v] = canvas_logit(row, batch.n_seq, b, i, v);
  };
}

TEST(Generate, ScheduleCountsThroughTheLoop) {
  struct Case {
    int64_t new_tokens;
    int steps;
    int64_t first, middle, last;
  };
  for (const Case& c : {Case{256, 256, 0, 1, 2}, Case{512, 512, 0, 1, 2}, Case{256, 128, 1, 2, 3},
                        Case{256, 64, 3, 4, 5}}) {
    SamplingParams p = small_params(c.new_tokens, c.steps);
    p.alg = Algorithm::kEntropy;
    p.temperature = 0.0f;
    FakeModel model(kVocab, peak(5));
    Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, p);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->committed_counts.size(), static_cast<size_t>(c.steps));
    for (int i = 0; i < c.steps; ++i) {
      const int64_t want = i == 0 ? c.first : i == c.steps - 1 ? c.last : c.middle;
      ASSERT_EQ(out->committed_counts[i][0], want) << c.new_tokens << "/" << c.steps << " step " << i;
    }
    EXPECT_EQ(out->generated[0], std::vector<int32_t>(c.new_tokens, 5));
    EXPECT_EQ(out->timings.steps_run, c.steps);
    // A step with k = 0 (step 0 when steps == new tokens) runs no forward.
    EXPECT_EQ(model.batches().size(), static_cast<size_t>(c.first == 0 ? c.steps - 1 : c.steps));
  }
}

TEST(Generate, ConfidenceTiesGoToLowestPosition) {
  for (Algorithm alg : {Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy}) {
    SamplingParams p = small_params(8, 8);
    p.alg = alg;
    p.temperature = 0.0f;
    FakeModel model(kVocab, peak(3));
    std::vector<int64_t> order;
    GenerateHooks hooks;
    hooks.on_step = [&](const StepInfo& info) {
      for (const MaskedPosition& mp : info.committed) order.push_back(mp.position);
      return true;
    };
    Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}}, p, hooks);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(order, (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9})) << algorithm_name(alg);
  }
}

TEST(Generate, LogitsShiftAndRequestedRows) {
  // The model's output at index i peaks at token (i % 10); position j must receive f(j − 1).
  testing::RowFn by_index = [](const ForwardBatch&, int64_t, int64_t i, float* logits) {
    std::fill(logits, logits + kVocab, 0.0f);
    logits[i % 10] = 10.0f;
  };
  SamplingParams p = small_params(5, 5);
  p.alg = Algorithm::kMaskgitPlus;
  p.temperature = 0.0f;
  FakeModel model(kVocab, by_index);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->generated[0], (std::vector<int32_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(model.batches()[0].out_rows, (std::vector<int64_t>{2, 3, 4, 5, 6}));

  // An empty prompt: positions 0 and 1 both read row 0 (requested once).
  FakeModel model2(kVocab, by_index);
  SamplingParams greedy = small_params(4, 1);
  greedy.temperature = 0.0f;
  Result<GenerateOutput> out2 = generate(model2.logits_fn(), kVocab, {{}}, greedy);
  ASSERT_TRUE(out2.ok()) << out2.status().to_string();
  EXPECT_EQ(out2->generated[0], (std::vector<int32_t>{0, 0, 1, 2}));
  EXPECT_EQ(model2.batches().front().out_rows, (std::vector<int64_t>{0, 1, 2}));
}

TEST(Generate, LeftPaddingBatchOfThree) {
  SamplingParams p = small_params(4, 4);
  p.alg = Algorithm::kEntropy;
  p.temperature = 0.0f;
  FakeModel model(kVocab, peak(7));
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {4, 5, 6, 7, 8}, {9, 10}};
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, prompts, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->n_rows, 3);
  EXPECT_EQ(out->n_seq, 9);
  EXPECT_EQ(out->prompt_width, 5);
  EXPECT_EQ(out->prompt_lengths, (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(out->pad_counts, (std::vector<int64_t>{2, 0, 3}));

  const testing::RecordedBatch& b = model.batches().front();
  EXPECT_EQ(b.n_batch, 3);
  EXPECT_EQ(b.n_seq, 9);
  ASSERT_TRUE(b.has_valid);
  ASSERT_TRUE(b.has_positions);
  const std::vector<int32_t> tokens{kPad, kPad, 1, 2, 3, kMask, kMask, kMask, kMask,  //
                                    4,    5,    6, 7, 8, kMask, kMask, kMask, kMask,  //
                                    kPad, kPad, kPad, 9, 10, kMask, kMask, kMask, kMask};
  const std::vector<uint8_t> valid{0, 0, 1, 1, 1, 1, 1, 1, 1,  //
                                   1, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                   0, 0, 0, 1, 1, 1, 1, 1, 1};
  const std::vector<int32_t> positions{1, 1, 0, 1, 2, 3, 4, 5, 6,  //
                                       0, 1, 2, 3, 4, 5, 6, 7, 8,  //
                                       1, 1, 1, 0, 1, 2, 3, 4, 5};
  EXPECT_EQ(b.tokens, tokens);
  EXPECT_EQ(b.valid, valid);
  EXPECT_EQ(b.positions, positions);
  // Masked positions 5..8 of each row need rows 4..7 (the shift).
  EXPECT_EQ(b.out_rows, (std::vector<int64_t>{4, 5, 6, 7, 13, 14, 15, 16, 22, 23, 24, 25}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out->generated[r], (std::vector<int32_t>{7, 7, 7, 7}));
    EXPECT_EQ(std::vector<int32_t>(out->sequences[r].begin(), out->sequences[r].begin() + 5),
              std::vector<int32_t>(tokens.begin() + r * 9, tokens.begin() + r * 9 + 5));
  }

  // Same-length prompts: no mask and default positions.
  FakeModel model2(kVocab, peak(7));
  ASSERT_TRUE(generate(model2.logits_fn(), kVocab, {{1, 2}, {3, 4}}, p).ok());
  EXPECT_FALSE(model2.batches().front().has_valid);
  EXPECT_FALSE(model2.batches().front().has_positions);
}

TEST(Generate, NumReturnSequencesRepeatsEachPromptConsecutively) {
  SamplingParams p = small_params(6, 3);
  p.num_return_sequences = 3;
  p.alg = Algorithm::kMaskgitPlus;
  p.seed = 5;
  FakeModel model(kVocab, [](const ForwardBatch&, int64_t, int64_t, float* logits) {
    std::fill(logits, logits + kVocab, 0.0f);  // uniform: rows should differ
    logits[kMask] = logits[kPad] = -1e9f;
  });
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2}, {3, 4, 5}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->n_rows, 6);
  EXPECT_EQ(out->pad_counts, (std::vector<int64_t>{1, 1, 1, 0, 0, 0}));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out->sequences[r][1], 1) << r;
  for (int r = 3; r < 6; ++r) EXPECT_EQ(out->sequences[r][0], 3) << r;
  std::set<std::vector<int32_t>> distinct(out->generated.begin(), out->generated.end());
  EXPECT_EQ(distinct.size(), 6u);
}

TEST(Generate, SeedDeterminesOutput) {
  for (Algorithm alg : {Algorithm::kOrigin, Algorithm::kEntropy}) {
    SamplingParams p = small_params(24, 6);
    p.alg = alg;
    auto run = [&](uint64_t seed) {
      p.seed = seed;
      FakeModel model(kVocab, canvas_model());
      Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3}, {4, 5, 6}}, p);
      EXPECT_TRUE(out.ok()) << out.status().to_string();
      return out->sequences;
    };
    EXPECT_EQ(run(1), run(1)) << algorithm_name(alg);
    EXPECT_NE(run(1), run(2)) << algorithm_name(alg);
  }
}

TEST(Generate, ThreadCountDoesNotChangeResults) {
  ThreadPool pool(3);
  for (Algorithm alg : {Algorithm::kOrigin, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy}) {
    SamplingParams p = small_params(40, 10);
    p.alg = alg;
    p.top_p = 0.9f;
    p.top_k = 6;
    p.alg_temp = alg == Algorithm::kEntropy ? 0.5f : 0.0f;
    GenerateHooks threaded;
    threaded.pool = &pool;
    FakeModel a(kVocab, canvas_model()), b(kVocab, canvas_model());
    Result<GenerateOutput> serial = generate(a.logits_fn(), kVocab, {{1, 2}, {3}}, p);
    Result<GenerateOutput> parallel = generate(b.logits_fn(), kVocab, {{1, 2}, {3}}, p, threaded);
    ASSERT_TRUE(serial.ok() && parallel.ok());
    EXPECT_EQ(serial->sequences, parallel->sequences) << algorithm_name(alg);
  }
}

TEST(Generate, OriginCommitsEverythingByTheEnd) {
  SamplingParams p = small_params(32, 7);
  p.alg = Algorithm::kOrigin;
  FakeModel model(kVocab, canvas_model());
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1}, {2, 3}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_EQ(std::count(out->generated[r].begin(), out->generated[r].end(), kMask), 0);
    int64_t total = 0;
    for (const auto& counts : out->committed_counts) total += counts[r];
    EXPECT_EQ(total, 32);
  }
  // Origin asks the model only for the positions that unmask this step.
  size_t requested = 0;
  for (const auto& batch : model.batches()) requested += batch.out_rows.size();
  EXPECT_EQ(requested, 64u);
}

TEST(Generate, CommittingTheMaskIdLeavesThePositionMasked) {
  // Position 4 (the first generated one) always predicts the mask id with certainty: it is the most
  // confident every step, "commits" the mask id and stays masked; the rest fill on the last step.
  testing::RowFn fn = [](const ForwardBatch&, int64_t, int64_t i, float* logits) {
    std::fill(logits, logits + kVocab, 0.0f);
    logits[i == 3 ? kMask : 2] = i == 3 ? 50.0f : 5.0f;
  };
  SamplingParams p = small_params(4, 4);
  p.alg = Algorithm::kMaskgitPlus;
  p.temperature = 0.0f;
  FakeModel model(kVocab, fn);
  Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, {{1, 2, 3, 4}}, p);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->generated[0], (std::vector<int32_t>{kMask, 2, 2, 2}));
  int64_t total = 0;
  for (const auto& counts : out->committed_counts) total += counts[0];
  EXPECT_EQ(total, 3);
}

// ---- Independent dense re-implementation of the greedy loop (spec §3.4–3.5, one row per prompt).

struct NaiveResult {
  std::vector<std::vector<int32_t>> canvas;
  std::vector<std::vector<int64_t>> counts;
};

NaiveResult naive_generate(const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens, int steps,
                           Algorithm alg, float top_p, int64_t top_k) {
  const int64_t n_rows = static_cast<int64_t>(prompts.size());
  const int64_t n_seq = static_cast<int64_t>(prompts[0].size()) + new_tokens;
  NaiveResult r;
  for (const auto& prompt : prompts) {
    r.canvas.push_back(prompt);
    r.canvas.back().resize(static_cast<size_t>(n_seq), kMask);
  }
  const std::vector<float> t = timesteps(steps, 1e-3f);
  for (int step = 0; step < steps; ++step) {
    struct Cand {
      int64_t pos;
      int32_t token;
      double conf;
    };
    std::vector<std::vector<Cand>> cands(static_cast<size_t>(n_rows));
    int64_t total = 0;
    for (int64_t b = 0; b < n_rows; ++b) {
      const std::vector<int32_t> row = r.canvas[b];
      for (int64_t j = 0; j < n_seq; ++j) {
        if (row[j] != kMask) continue;
        ++total;
        std::vector<double> x(kVocab);
        for (int64_t v = 0; v < kVocab; ++v) x[v] = canvas_logit(row.data(), n_seq, b, std::max<int64_t>(j - 1, 0), v);
        // top-p: stable sort, softmax, shifted removal; then top-k threshold; then softmax.
        std::vector<int64_t> order(kVocab);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return x[a] > x[c]; });
        std::vector<bool> removed(kVocab, false);
        if (top_p < 1.0f) {
          double z = 0, c = 0;
          for (double v : x) z += std::exp(v - x[order[0]]);
          for (int64_t i = 0; i < kVocab; ++i) {
            if (i > 0 && static_cast<float>(c) > top_p) removed[order[i]] = true;
            c += std::exp(x[order[i]] - x[order[0]]) / z;
          }
        }
        if (top_k > 0 && top_k < kVocab) {
          std::vector<double> kept;
          for (int64_t v = 0; v < kVocab; ++v) kept.push_back(removed[v] ? -INFINITY : x[v]);
          std::sort(kept.begin(), kept.end(), std::greater<double>());
          for (int64_t v = 0; v < kVocab; ++v)
            if (x[v] < kept[top_k - 1]) removed[v] = true;
        }
        std::vector<double> p(kVocab, 0.0);
        double z = 0;
        for (int64_t v = 0; v < kVocab; ++v)
          if (!removed[v]) z += (p[v] = std::exp(x[v] - x[order[0]]));
        for (double& v : p) v /= z;
        const int32_t token = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
        std::vector<double> sorted = p;
        std::sort(sorted.begin(), sorted.end(), std::greater<double>());
        double conf = p[token];
        if (alg == Algorithm::kTopkMargin) conf = sorted[0] - sorted[1];
        if (alg == Algorithm::kEntropy) {
          conf = 0;
          for (double v : p) conf += v * std::log(v + 1e-10);
        }
        cands[b].push_back({j, token, conf});
      }
    }
    const int64_t k = transfer_count(static_cast<float>(total) / static_cast<float>(n_rows), t[step], t[step + 1],
                                     step == steps - 1);
    std::vector<int64_t> counts(static_cast<size_t>(n_rows), 0);
    for (int64_t b = 0; b < n_rows; ++b) {
      std::vector<Cand>& c = cands[b];
      std::stable_sort(c.begin(), c.end(), [](const Cand& a, const Cand& d) { return a.conf > d.conf; });
      for (int64_t i = 0; i < std::min<int64_t>(k, static_cast<int64_t>(c.size())); ++i) {
        r.canvas[b][c[i].pos] = c[i].token;
        ++counts[b];
      }
    }
    r.counts.push_back(counts);
  }
  return r;
}

TEST(Generate, GreedyMatchesDenseReimplementation) {
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {4, 5, 6}};
  for (Algorithm alg : {Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy}) {
    for (auto [top_p, top_k] : {std::pair{1.0f, int64_t{0}}, {0.9f, int64_t{50}}, {0.6f, int64_t{3}}}) {
      for (auto [new_tokens, steps] : {std::pair{int64_t{12}, 12}, {int64_t{20}, 6}, {int64_t{8}, 19}}) {
        SamplingParams p = small_params(new_tokens, steps);
        p.alg = alg;
        p.temperature = 0.0f;
        p.top_p = top_p;
        p.top_k = top_k;
        FakeModel model(kVocab, canvas_model());
        Result<GenerateOutput> out = generate(model.logits_fn(), kVocab, prompts, p);
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        const NaiveResult want = naive_generate(prompts, new_tokens, steps, alg, top_p, top_k);
        EXPECT_EQ(out->sequences, want.canvas)
            << algorithm_name(alg) << " top_p " << top_p << " top_k " << top_k << " " << new_tokens << "/" << steps;
        EXPECT_EQ(out->committed_counts, want.counts);
      }
    }
  }
}

}  // namespace
}  // namespace dc
