// make_masked_batch: prompt positions never masked, mask rate t, the logits shift of the loss rows,
// the 1/(t·Z) weights of both normalisations, determinism from the key, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "train/masked_diffusion.h"

namespace dc::train {
namespace {

constexpr int32_t kMask = 99;

TrainSequence sequence(int64_t L, int64_t prompt, int32_t first_token) {
  TrainSequence s;
  for (int64_t j = 0; j < L; ++j) s.tokens.push_back(static_cast<int32_t>(first_token + j % 50));
  s.loss_mask.assign(L, 1);
  std::fill_n(s.loss_mask.begin(), prompt, 0);
  return s;
}

TEST(MaskedBatch, PromptNeverMaskedRowsShiftedAndWeightsOneOverTZ) {
  const std::vector<TrainSequence> seqs = {sequence(40, 10, 0), sequence(40, 25, 1)};
  MaskingOptions o;
  o.mask_token_id = kMask;
  for (LossNorm norm : {LossNorm::kTokens, LossNorm::kSequences}) {
    o.norm = norm;
    auto m = make_masked_batch(seqs, o, 1234, 100);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->n_batch, 2);
    EXPECT_EQ(m->n_seq, 40);
    EXPECT_EQ(m->n_maskable, 30 + 15);
    size_t r = 0;
    for (int64_t b = 0; b < 2; ++b) {
      const double t = m->t[b];
      EXPECT_GE(t, o.eps);
      EXPECT_LT(t, 1.0);
      const double z = norm == LossNorm::kTokens ? 45.0 : 2.0 * (b == 0 ? 30 : 15);
      for (int64_t j = 0; j < 40; ++j) {
        const int32_t tok = m->tokens[b * 40 + j];
        if (!seqs[b].loss_mask[j]) {
          ASSERT_EQ(tok, seqs[b].tokens[j]) << "prompt position " << j << " of sequence " << b << " was masked";
          continue;
        }
        if (tok != kMask) continue;
        ASSERT_LT(r, m->out_rows.size());
        EXPECT_EQ(m->out_rows[r], b * 40 + j - 1) << "the token at j is predicted by the output at j - 1";
        EXPECT_EQ(m->targets[r], seqs[b].tokens[j]);
        EXPECT_NEAR(m->weights[r], 1.0 / (t * z), 1e-6 / (t * z));
        ++r;
      }
    }
    EXPECT_EQ(r, m->out_rows.size());
  }
}

TEST(MaskedBatch, MaskRateFollowsTAndTheKeyDecides) {
  std::vector<TrainSequence> seqs(64, sequence(256, 0, 0));
  MaskingOptions o;
  o.mask_token_id = kMask;
  auto a = make_masked_batch(seqs, o, 7, 100);
  auto b = make_masked_batch(seqs, o, 7, 100);
  auto c = make_masked_batch(seqs, o, 8, 100);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->t, b->t);
  EXPECT_NE(a->tokens, c->tokens);
  double mean_t = 0;
  for (int64_t s = 0; s < 64; ++s) {
    int64_t masked = 0;
    for (int64_t j = 0; j < 256; ++j) masked += a->tokens[s * 256 + j] == kMask;
    const double t = a->t[s], sd = std::sqrt(256 * t * (1 - t));
    EXPECT_NEAR(masked, 256 * t, 5 * sd + 1) << "sequence " << s << ", t = " << t;  // binomial, 5 sigma
    mean_t += t / 64;
  }
  EXPECT_NEAR(mean_t, 0.5, 5 * std::sqrt(1.0 / 12 / 64));  // t ~ U(eps, 1)
}

TEST(MaskedBatch, FixedTAndMaskReproduceAGivenBatch) {
  const std::vector<TrainSequence> seqs = {sequence(6, 2, 0)};
  MaskingOptions o;
  o.mask_token_id = kMask;
  o.fixed_t = {0.25};
  o.fixed_mask = {0, 0, 1, 0, 1, 1};
  auto m = make_masked_batch(seqs, o, 0, 100);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->tokens, (std::vector<int32_t>{0, 1, kMask, 3, kMask, kMask}));
  EXPECT_EQ(m->out_rows, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(m->targets, (std::vector<int32_t>{2, 4, 5}));
  for (float w : m->weights) EXPECT_FLOAT_EQ(w, 1.0f / (0.25f * 4.0f));
}

TEST(MaskedBatch, BadInputNamesTheProblem) {
  MaskingOptions o;
  o.mask_token_id = kMask;
  auto msg = [&](const std::vector<TrainSequence>& s, const MaskingOptions& opt) {
    auto m = make_masked_batch(s, opt, 0, 100);
    EXPECT_FALSE(m.ok());
    return m.ok() ? std::string() : m.status().message();
  };
  EXPECT_NE(msg({}, o).find("no sequences"), std::string::npos);
  EXPECT_NE(msg({sequence(6, 0, 0), sequence(5, 0, 0)}, o).find("sequence 1"), std::string::npos);
  TrainSequence bad = sequence(6, 0, 0);
  bad.tokens[3] = 100;  // outside the vocabulary of 100
  EXPECT_NE(msg({bad}, o).find("token 3"), std::string::npos);
  MaskingOptions fixed = o;
  fixed.fixed_t = {0.5};
  fixed.fixed_mask = {1, 0, 0, 0, 0, 0};
  EXPECT_NE(msg({sequence(6, 2, 0)}, fixed).find("prompt position 0"), std::string::npos);
  MaskingOptions eps = o;
  eps.eps = 1.0;
  EXPECT_NE(msg({sequence(6, 0, 0)}, eps).find("eps"), std::string::npos);
}

}  // namespace
}  // namespace dc::train
