// The sampler's row loops in each variant the CPU has (sampler/row_kernels.h: baseline, AVX2 + FMA,
// AVX-512; core/kernel_variant.h) give the baseline variant's bits: the kernels called directly, and
// filtered_distribution / sample_token / softmax_in_place with the level capped (set_cpu_level_cap_for_testing,
// as DC_CPU_LEVEL does) on rows with ties, ±0, −inf and lengths that are no multiple of a vector or block.
#include "sampler/row_kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_level.h"
#include "sampler/filters.h"
#include "sampler/rng.h"

// The variants, called directly (their definitions: row_kernels.cc and the files that include it).
#define DC_DECLARE_VARIANTS(ns)                                   \
  namespace dc::row_kernels::ns {                                 \
  decltype(::dc::row_kernels::scan_row) scan_row;                 \
  decltype(::dc::row_kernels::sum_exp) sum_exp;                   \
  decltype(::dc::row_kernels::any_greater) any_greater;           \
  decltype(::dc::row_kernels::exp_rows) exp_rows;                 \
  decltype(::dc::row_kernels::normalize) normalize;               \
  }
DC_DECLARE_VARIANTS(baseline)
DC_DECLARE_VARIANTS(avx2)
DC_DECLARE_VARIANTS(avx512)
#undef DC_DECLARE_VARIANTS

// (its own namespace: the test files of a folder are compiled as unity translation units)
namespace dc::row_kernels_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One variant's functions, and the level it needs.
struct Variant {
  const char* name;
  CpuLevel level;
  decltype(&row_kernels::scan_row) scan_row;
  decltype(&row_kernels::sum_exp) sum_exp;
  decltype(&row_kernels::any_greater) any_greater;
  decltype(&row_kernels::exp_rows) exp_rows;
  decltype(&row_kernels::normalize) normalize;
};

#define DC_VARIANT(ns, lvl)                                                                                 \
  Variant {                                                                                                 \
    #ns, lvl, row_kernels::ns::scan_row, row_kernels::ns::sum_exp, row_kernels::ns::any_greater,              \
        row_kernels::ns::exp_rows, row_kernels::ns::normalize                                               \
  }
const Variant kVariants[] = {DC_VARIANT(baseline, CpuLevel::kBaseline), DC_VARIANT(avx2, CpuLevel::kAvx2),
                             DC_VARIANT(avx512, CpuLevel::kAvx512)};
#undef DC_VARIANT

// Logits like a model's (normal, a few large), with exact ties, ±0 and banned (−inf) tokens.
std::vector<float> make_row(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(gen);
  for (int64_t i = 0; i < n; i += 97) x[static_cast<size_t>(i)] = 12.5f;  // ties at the top
  for (int64_t i = 5; i < n; i += 131) x[static_cast<size_t>(i)] = -kInf;
  for (int64_t i = 7; i < n; i += 389) x[static_cast<size_t>(i)] = (i & 8) ? 0.0f : -0.0f;
  return x;
}

// Float vectors equal bit for bit, naming the first index that differs.
void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(want[i]), std::bit_cast<uint32_t>(got[i]))
        << what << " index " << i << ": " << want[i] << " vs " << got[i] << " (tolerance: none)";
  }
}

class RowKernelsTest : public ::testing::Test {
 protected:
  void TearDown() override { set_cpu_level_cap_for_testing(CpuLevel::kNative); }
  static bool available(const Variant& v) { return cpu_detected_level() >= v.level; }
};

TEST_F(RowKernelsTest, EveryVariantGivesTheBaselineBits) {
  const Variant& base = kVariants[0];
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{513}, int64_t{20011}}) {
    const std::vector<float> row = make_row(n, static_cast<uint32_t>(n));
    std::vector<int32_t> ids;
    for (int64_t i = n - 1; i >= 0; i -= 3) ids.push_back(static_cast<int32_t>(i));  // a gather, out of order
    for (const Variant& v : kVariants) {
      if (!available(v)) continue;
      const std::string at = std::string(v.name) + " n=" + std::to_string(n);
      for (const bool divide : {false, true}) {
        std::vector<float> want = row, got = row;
        bool want_bad = false, got_bad = true;
        const float want_max = base.scan_row(want.data(), n, divide, 0.7f, want_bad);
        const float got_max = v.scan_row(got.data(), n, divide, 0.7f, got_bad);
        EXPECT_EQ(want_max, got_max) << at;
        EXPECT_EQ(want_bad, got_bad) << at;
        expect_same_bits(want, got, at + " scan_row");
      }
      std::vector<float> nan_row = row;
      nan_row[static_cast<size_t>(n / 2)] = std::nanf("");
      bool bad = false;
      v.scan_row(nan_row.data(), n, false, 1.0f, bad);
      EXPECT_TRUE(bad) << at;
      const float max = base.scan_row(std::vector<float>(row).data(), n, false, 1.0f, bad);
      EXPECT_EQ(std::bit_cast<uint64_t>(base.sum_exp(row.data(), n, max)),
                std::bit_cast<uint64_t>(v.sum_exp(row.data(), n, max))) << at;
      EXPECT_EQ(base.any_greater(row.data(), n, 12.0f), v.any_greater(row.data(), n, 12.0f)) << at;
      EXPECT_EQ(base.any_greater(row.data(), n, 12.5f), v.any_greater(row.data(), n, 12.5f)) << at;
      for (const bool gather : {false, true}) {
        const int64_t m = gather ? static_cast<int64_t>(ids.size()) : n;
        const int32_t* id = gather ? ids.data() : nullptr;
        std::vector<float> want(static_cast<size_t>(m)), got(static_cast<size_t>(m));
        const double want_z = base.exp_rows(row.data(), id, m, max, want.data());
        const double got_z = v.exp_rows(row.data(), id, m, max, got.data());
        EXPECT_EQ(std::bit_cast<uint64_t>(want_z), std::bit_cast<uint64_t>(got_z)) << at;
        base.normalize(want.data(), m, want_z);
        v.normalize(got.data(), m, got_z);
        expect_same_bits(want, got, at + (gather ? " exp_rows gathered" : " exp_rows"));
      }
    }
  }
}

// What filtered_distribution / sample_token return for one row and config.
struct Outcome {
  std::vector<float> probs, softmax;
  std::vector<int32_t> ids, tokens;
  std::vector<float> confidences;
};

Outcome run_filters(const std::vector<float>& row, const FilterConfig& config) {
  Outcome out;
  FilterScratch scratch;
  std::vector<float> x = row;
  EXPECT_TRUE(filtered_distribution(x.data(), static_cast<int64_t>(x.size()), config, scratch).ok());
  out.probs = scratch.probs;
  out.ids = scratch.ids;
  for (ConfidenceKind kind : {ConfidenceKind::kProbability, ConfidenceKind::kMargin, ConfidenceKind::kNegEntropy}) {
    x = row;
    Rng rng = Rng::for_stream(7, RngPurpose::kToken, 3, 1, 42);
    Result<TokenSample> s = sample_token(x.data(), static_cast<int64_t>(x.size()), config, kind, rng, scratch);
    EXPECT_TRUE(s.ok());
    out.tokens.push_back(s->token);
    out.confidences.push_back(s->confidence);
  }
  out.softmax = row;
  for (float& v : out.softmax) v = v == -kInf ? -1e4f : v;
  softmax_in_place(out.softmax.data(), static_cast<int64_t>(out.softmax.size()));
  return out;
}

TEST_F(RowKernelsTest, FiltersGiveTheSameBitsAtEveryLevel) {
  const std::vector<float> row = make_row(30013, 11);
  const FilterConfig configs[] = {{0.0f, 1.0f, 0},   {0.7f, 1.0f, 0},    {1.0f, 0.9f, 0},
                                  {1.0f, 1.0f, 50},  {0.5f, 0.95f, 1000}, {1.3f, 0.5f, 0}};
  for (const FilterConfig& config : configs) {
    set_cpu_level_cap_for_testing(CpuLevel::kBaseline);
    const Outcome want = run_filters(row, config);
    for (const Variant& v : kVariants) {
      if (!available(v) || v.level == CpuLevel::kBaseline) continue;
      set_cpu_level_cap_for_testing(v.level);
      ASSERT_EQ(cpu_level(), v.level);
      const Outcome got = run_filters(row, config);
      const std::string at = std::string(v.name) + " T=" + std::to_string(config.temperature) +
                             " top_p=" + std::to_string(config.top_p) + " top_k=" + std::to_string(config.top_k);
      EXPECT_EQ(want.ids, got.ids) << at;
      EXPECT_EQ(want.tokens, got.tokens) << at;
      expect_same_bits(want.probs, got.probs, at + " probs");
      expect_same_bits(want.confidences, got.confidences, at + " confidences");
      expect_same_bits(want.softmax, got.softmax, at + " softmax_in_place");
    }
  }
}

}  // namespace
}  // namespace dc::row_kernels_test
