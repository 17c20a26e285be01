// Shared by the head sampler tests of both devices: a merged step's results (HeadSampler::sample_parts) against
// each part sampled alone by the same head.
#pragma once

#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "ops/head_sampler.h"

namespace dc::testing {

// Expects every part's status ok and its share of `merged` (the parts' samples one after the other) equal to
// head.sample(part) token for token and confidence for confidence (bit for bit).
inline void expect_parts_equal_alone(HeadSampler& head, std::span<const HeadSampling> parts,
                                     std::span<const TokenSample> merged, std::span<const Status> status) {
  size_t at = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    EXPECT_TRUE(status[p].ok()) << "part " << p << ": " << status[p].to_string();
    std::vector<TokenSample> alone(parts[p].rows.size());
    ASSERT_TRUE(head.sample(parts[p], alone).ok());
    for (size_t e = 0; e < alone.size(); ++e, ++at) {
      EXPECT_EQ(merged[at].token, alone[e].token) << "part " << p << " entry " << e;
      EXPECT_EQ(merged[at].confidence, alone[e].confidence) << "part " << p << " entry " << e;
    }
  }
  EXPECT_EQ(at, merged.size());
}

}  // namespace dc::testing
