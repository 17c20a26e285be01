// Issue 20: generation through a chunked HeadSampler (logits a few rows at a time) gives exactly what the
// full path (one [n_out, n_vocab] buffer per step) gives, for every algorithm, temperature, cache mode,
// batch and hook, with chunk sizes that do and do not divide the rows; and it never holds more than a
// chunk of logit rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "sampler/fake_model.h"
#include "sampler/filters.h"
#include "sampler/generate.h"

namespace dc {
namespace {

using testing::FakeModel;
using testing::hash_unit;

constexpr int64_t kHeadVocab = 40;
constexpr int32_t kHeadMask = 39;
constexpr int32_t kHeadPad = 38;

// Logits that depend on the tokens around index i (so every step differs) and never favour the mask.
void context_row(const ForwardBatch& batch, int64_t b, int64_t i, float* logits) {
  const int32_t* row = batch.tokens + b * batch.n_seq;
  const uint64_t left = i > 0 ? static_cast<uint64_t>(row[i - 1]) : 0;
  for (int64_t v = 0; v < kHeadVocab; ++v)
    logits[v] = 3.0f * hash_unit(static_cast<uint64_t>(v), static_cast<uint64_t>(i) * 977 + left,
                                 static_cast<uint64_t>(row[i]));
  logits[kHeadMask] = -1e4f;
}

// A HeadSampler over a RowFn that, like a backend's, computes logits only chunk by chunk: its "hidden
// rows" are the forward's inputs. Records the most logit rows it held at once.
class ChunkedHead final : public HeadSampler {
 public:
  ChunkedHead(testing::RowFn fn, int64_t chunk_rows) : fn_(std::move(fn)), chunk_rows_(chunk_rows) {}

  void forward(const ForwardBatch& batch) {
    batch_ = batch;
    const int64_t n = batch.n_batch * batch.n_seq;
    tokens_.assign(batch.tokens, batch.tokens + n);
    positions_.assign(batch.positions ? batch.positions : batch.tokens, batch.positions ? batch.positions + n : batch.tokens);
    valid_.assign(batch.valid ? batch.valid : nullptr, batch.valid ? batch.valid + n : nullptr);
    out_rows_.assign(batch.out_rows, batch.out_rows + batch.n_out);
    batch_.tokens = tokens_.data();
    batch_.positions = batch.positions ? positions_.data() : nullptr;
    batch_.valid = batch.valid ? valid_.data() : nullptr;
    batch_.out_rows = out_rows_.data();
  }
  int64_t n_rows() const override { return batch_.n_out; }
  Status logits(int64_t first, int64_t n, float* out) override {
    for (int64_t r = 0; r < n; ++r) row(first + r, out + r * kHeadVocab);
    return Status::ok_status();
  }
  Status sample(const HeadSampling& args, std::span<TokenSample> out) override {
    const int64_t n = static_cast<int64_t>(args.rows.size());
    int64_t e = 0;
    while (e < n) {
      const int64_t c0 = args.rows[e].hidden_row, e_begin = e;
      while (e < n && args.rows[e].hidden_row < c0 + chunk_rows_) ++e;
      const int64_t rows = args.rows[e - 1].hidden_row + 1 - c0;
      block_.assign(static_cast<size_t>(rows * kHeadVocab), 0.0f);
      max_rows_ = std::max(max_rows_, rows);
      for (int64_t r = 0; r < rows; ++r) row(c0 + r, block_.data() + r * kHeadVocab);
      DC_RETURN_IF_ERROR(sample_head_rows(args, e_begin, e, block_.data(), c0, kHeadVocab, nullptr, out));
    }
    return Status::ok_status();
  }
  int64_t max_rows() const { return max_rows_; }

 private:
  void row(int64_t hidden_row, float* out) const {
    const int64_t flat = out_rows_[static_cast<size_t>(hidden_row)];
    fn_(batch_, flat / batch_.n_seq, flat % batch_.n_seq, out);
  }
  testing::RowFn fn_;
  int64_t chunk_rows_;
  ForwardBatch batch_;
  std::vector<int32_t> tokens_, positions_;
  std::vector<uint8_t> valid_;
  std::vector<int64_t> out_rows_;
  std::vector<float> block_;
  int64_t max_rows_ = 0;
};

HeadFn chunked_fn(const std::shared_ptr<ChunkedHead>& head) {
  return [head](const ForwardBatch& batch) -> Result<HeadSampler*> {
    head->forward(batch);
    return static_cast<HeadSampler*>(head.get());
  };
}

SamplingParams base(int64_t new_tokens, int steps) {
  SamplingParams p;
  p.max_new_tokens = new_tokens;
  p.steps = steps;
  p.mask_token_id = kHeadMask;
  p.pad_token_id = kHeadPad;
  p.top_k = 0;
  return p;
}

struct Case {
  std::string name;
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams params;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const Algorithm algs[] = {Algorithm::kOrigin, Algorithm::kMaskgitPlus, Algorithm::kTopkMargin, Algorithm::kEntropy};
  for (Algorithm alg : algs) {
    for (int t = 0; t < 3; ++t) {
      SamplingParams p = base(23, 9);
      p.alg = alg;
      p.seed = 11 + t;
      if (t == 1) p.temperature = 0.0f;
      if (t == 2) p.temperature = 0.7f, p.top_p = 0.9f, p.top_k = 7;
      out.push_back({std::string(algorithm_name(alg)) + " t" + std::to_string(t), {{1, 2, 3}}, p});
    }
  }
  SamplingParams batch = base(17, 6);  // two prompts of different lengths (padding), two rows each
  batch.alg = Algorithm::kEntropy, batch.num_return_sequences = 2, batch.seed = 4;
  out.push_back({"batch", {{1, 2, 3, 4, 5}, {6, 7}}, batch});
  SamplingParams prefix = base(20, 10);
  prefix.alg = Algorithm::kMaskgitPlus, prefix.cache = CacheMode::kPrefix, prefix.block_length = 6;
  out.push_back({"prefix", {{1, 2}, {3}}, prefix});
  SamplingParams dual = base(20, 10);
  dual.cache = CacheMode::kDual, dual.block_length = 8, dual.threshold = 0.3f;
  out.push_back({"dual threshold", {{5, 6, 7}}, dual});
  SamplingParams factor = base(15, 15);
  factor.alg = Algorithm::kTopkMargin, factor.factor = 1.5f, factor.temperature = 0.5f;
  out.push_back({"factor", {{9}}, factor});
  SamplingParams alg_temp = base(12, 4);
  alg_temp.alg = Algorithm::kMaskgitPlus, alg_temp.alg_temp = 0.4f, alg_temp.seed = 8;
  out.push_back({"alg_temp", {{2, 4}}, alg_temp});
  SamplingParams shared = base(6, 4);  // masks at positions 0 and 1: both read row 0 (one hidden row)
  shared.alg = Algorithm::kEntropy, shared.seed = 2, shared.temperature = 0.5f;  // divides the row in place
  out.push_back({"shared row", {{kHeadMask, kHeadMask, 3}}, shared});
  return out;
}

TEST(HeadSampler, ChunkedEqualsFullPathForEveryCaseAndChunkSize) {
  for (const Case& c : cases()) {
    FakeModel full(kHeadVocab, context_row);
    Result<GenerateOutput> want = generate(full.logits_fn(), kHeadVocab, c.prompts, c.params);
    ASSERT_TRUE(want.ok()) << c.name << ": " << want.status().to_string();
    for (int64_t chunk : {1, 3, 7, 64}) {
      auto head = std::make_shared<ChunkedHead>(context_row, chunk);
      Result<GenerateOutput> got = generate(chunked_fn(head), kHeadVocab, c.prompts, c.params);
      ASSERT_TRUE(got.ok()) << c.name << " chunk " << chunk << ": " << got.status().to_string();
      EXPECT_EQ(got->sequences, want->sequences) << c.name << " chunk " << chunk;
      EXPECT_EQ(got->committed_counts, want->committed_counts) << c.name << " chunk " << chunk;
      EXPECT_LE(head->max_rows(), chunk) << c.name;
      EXPECT_GT(head->max_rows(), 0) << c.name;
    }
  }
}

// sample_head_rows against sample_token on a fresh copy of each entry's row: entries sharing a row (and
// the temperature dividing it in place) each see it intact, and each draws from its own stream.
TEST(HeadSampler, SampleHeadRowsEqualsSampleTokenPerEntry) {
  const int64_t n_rows = 3;
  std::vector<float> logits(static_cast<size_t>(n_rows * kHeadVocab));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 2.0f * hash_unit(i, 5);
  const std::vector<float> original = logits;
  const std::vector<HeadRow> rows = {{10, 0, 0}, {10, 0, 1}, {11, 1, 4}, {12, 1, 5}, {12, 2, 5}};
  HeadSampling args{FilterConfig{0.5f, 0.95f, 9}, ConfidenceKind::kNegEntropy, 77, 3, rows};
  std::vector<TokenSample> got(rows.size());
  ASSERT_TRUE(sample_head_rows(args, 0, static_cast<int64_t>(rows.size()), logits.data(), 10, kHeadVocab, nullptr, got).ok());
  for (size_t e = 0; e < rows.size(); ++e) {
    std::vector<float> row(original.begin() + (rows[e].hidden_row - 10) * kHeadVocab,
                           original.begin() + (rows[e].hidden_row - 9) * kHeadVocab);
    Rng rng = Rng::for_stream(77, RngPurpose::kToken, 3, rows[e].row, rows[e].position);
    FilterScratch scratch;
    Result<TokenSample> want = sample_token(row.data(), kHeadVocab, args.filter, args.kind, rng, scratch);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(got[e].token, want->token) << "entry " << e;
    EXPECT_EQ(got[e].confidence, want->confidence) << "entry " << e;
  }
}

// A logits_hook needs whole rows: they are materialised through HeadSampler::logits and the hook's edits
// decide the tokens, as on the full path. A custom policy sees the same confidences.
TEST(HeadSampler, HooksSeeTheFullRowsOnTheChunkedPath) {
  SamplingParams p = base(10, 5);
  p.alg = Algorithm::kMaskgitPlus;
  p.temperature = 0.0f;
  std::vector<std::vector<float>> confidences[2];
  for (int path = 0; path < 2; ++path) {
    GenerateHooks hooks;
    hooks.logits_hook = [](const LogitsHookArgs& a) {
      for (size_t e = 0; e < a.positions.size(); ++e) {
        float* row = a.logits.data() + e * static_cast<size_t>(a.n_vocab);
        row[a.positions[e].position % 5] += 50.0f;  // forces token position % 5
      }
    };
    hooks.unmask_policy = [&, path](const PolicyInput& in) {
      confidences[path].emplace_back(in.confidences.begin(), in.confidences.end());
      return std::vector<int64_t>{in.masked_positions.front()};
    };
    FakeModel full(kHeadVocab, context_row);
    auto head = std::make_shared<ChunkedHead>(context_row, 3);
    Result<GenerateOutput> out = path == 0 ? generate(full.logits_fn(), kHeadVocab, {{1, 2}}, p, hooks)
                                           : generate(chunked_fn(head), kHeadVocab, {{1, 2}}, p, hooks);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(out->generated[0][j], (2 + j) % 5) << "position " << 2 + j;
  }
  EXPECT_EQ(confidences[0], confidences[1]);
}

// A non-finite logit found in a chunk fails the step naming the position, as on the full path.
TEST(HeadSampler, NonFiniteLogitsNameThePositionOnBothPaths) {
  auto nan_at_7 = [](const ForwardBatch& batch, int64_t b, int64_t i, float* logits) {
    context_row(batch, b, i, logits);
    if (i == 7) logits[3] = std::numeric_limits<float>::quiet_NaN();
  };
  SamplingParams p = base(8, 4);
  p.alg = Algorithm::kEntropy;
  FakeModel full(kHeadVocab, nan_at_7);
  auto head = std::make_shared<ChunkedHead>(nan_at_7, 2);
  Result<GenerateOutput> a = generate(full.logits_fn(), kHeadVocab, {{1, 2}}, p);
  Result<GenerateOutput> b = generate(chunked_fn(head), kHeadVocab, {{1, 2}}, p);
  ASSERT_FALSE(a.ok());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(a.status().to_string(), b.status().to_string());
  EXPECT_NE(b.status().message().find("position 8"), std::string::npos) << b.status().to_string();
}

}  // namespace
}  // namespace dc
