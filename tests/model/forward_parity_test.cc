// Model::forward against the PyTorch reference logits on every tiny fixture checkpoint (f32, bf16,
// single file and sharded, three GQA ratios, odd lengths, left-padded batches, explicit positions).
#include <gtest/gtest.h>

#include <cmath>

#include "batch_case.h"
#include "fixtures.h"
#include "model/transformer.h"

namespace dc {
namespace {

// Runs every fixture case through Model::forward with `ctx` (with `packed`, on weights re-laid by
// Model::pack_weights, their mapped pages released) and expects the relative L2 error of the logits
// against the PyTorch reference, sqrt(Σ(got - want)² / Σ want²), to be at most `tol`; returns the largest.
double check_all_fixtures(const Context& ctx, double tol, const char* label, bool packed = false) {
  const auto manifest = dc::testing::load_manifest();
  int n_cases = 0;
  double worst = 0;
  for (const auto& m : manifest["models"]) {
    const std::string dir = dc::testing::fixtures_dir() + "/" + m["dir"].get<std::string>();
    auto model = Model::load(dir);
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    if (!model.ok()) return worst;
    if (packed) {
      EXPECT_TRUE((*model)->pack_weights(ctx).ok());
    }
    const auto fwd = dc::testing::load_json(dir + "/reference/forward.json");
    const int64_t V = (*model)->config().n_vocab;
    for (const auto& c : fwd["cases"]) {
      const BatchCase k = forward_fixture_case(c);
      const std::vector<int64_t>& rows = k.rows;  // real rows only: pad rows may hold any finite value
      std::vector<float> logits(rows.size() * V);
      EXPECT_TRUE((*model)->forward(ctx, k.view(), logits.data()).ok());
      const auto ref = dc::testing::load_f32(dir + "/reference/" + c["logits_file"].get<std::string>());
      EXPECT_EQ(ref.size(), static_cast<size_t>(k.B * k.L * V));
      if (ref.size() != static_cast<size_t>(k.B * k.L * V)) return worst;
      double diff2 = 0, ref2 = 0, max_abs = 0;
      for (size_t i = 0; i < rows.size(); ++i)
        for (int64_t v = 0; v < V; ++v) {
          const double want = ref[rows[i] * V + v], got = logits[i * V + v];
          EXPECT_TRUE(std::isfinite(got)) << "row " << rows[i] << " vocab " << v;
          if (!std::isfinite(got)) return worst;
          diff2 += (got - want) * (got - want);
          ref2 += want * want;
          max_abs = std::max(max_abs, std::abs(got - want));
        }
      const double rel = std::sqrt(diff2 / ref2);
      worst = std::max(worst, rel);
      std::printf("  [%s] %s/%s: rel %.2e max_abs %.2e\n", label, m["name"].get<std::string>().c_str(),
                  c["name"].get<std::string>().c_str(), rel, max_abs);
      EXPECT_LE(rel, tol) << label << " " << m["name"] << "/" << c["name"] << ": max |Δ| " << max_abs;
      ++n_cases;
    }
  }
  EXPECT_GE(n_cases, 15);
  return worst;
}

// The reference kernels and the fast kernels at their default precision (f32 activations) both match
// the f32 PyTorch reference to 1e-5.
TEST(ForwardParity, AllFixtureModelsMatchReference) {
  ThreadPool pool(2);
  Context reference{Device::kCpu, &pool};
  reference.reference_kernels = true;
  check_all_fixtures(reference, 1e-5, "reference kernels");
  Context fast{Device::kCpu, &pool};
  check_all_fixtures(fast, 1e-5, "fast kernels");
}

// Fast kernels with bf16-rounded activations (MatmulPrecision::kBF16; only the bf16-weight fixtures
// change): the logits stay within 1e-2 relative L2 of the f32 reference (measured: 3.0e-3 to 3.8e-3).
TEST(ForwardParity, Bf16ActivationsStayWithinLooseTolerance) {
  ThreadPool pool(2);
  Context ctx{Device::kCpu, &pool};
  ctx.matmul_precision = MatmulPrecision::kBF16;
  const double worst = check_all_fixtures(ctx, 1e-2, "fast kernels, bf16 activations");
  EXPECT_GT(worst, 0.0);
}

// Weights in the kPanels layout (what Engine does for --precision bf16) give the same parity with
// every kernel and precision; the bf16 fixtures are the ones that change layout.
TEST(ForwardParity, PackedWeightsMatchReference) {
  ThreadPool pool(2);
  Context reference{Device::kCpu, &pool};
  reference.reference_kernels = true;
  check_all_fixtures(reference, 1e-5, "reference kernels, packed", true);
  Context fast{Device::kCpu, &pool};
  check_all_fixtures(fast, 1e-5, "fast kernels, packed", true);
  Context bf16{Device::kCpu, &pool};
  bf16.matmul_precision = MatmulPrecision::kBF16;
  check_all_fixtures(bf16, 1e-2, "fast kernels, bf16 activations, packed", true);
}

TEST(ForwardParity, PadRowsAreFiniteAndThreadCountDoesNotChangeLogits) {
  const auto manifest = dc::testing::load_manifest();
  ASSERT_FALSE(manifest["models"].empty());
  const std::string dir = dc::testing::fixtures_dir() + "/" + manifest["models"][1]["dir"].get<std::string>();
  auto model = Model::load(dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const auto fwd = dc::testing::load_json(dir + "/reference/forward.json");
  for (const auto& c : fwd["cases"]) {
    if (c["attention_mask"].is_null()) continue;
    const BatchCase k = forward_fixture_case(c);
    std::vector<int64_t> rows(k.B * k.L);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    const int64_t V = (*model)->config().n_vocab;
    std::vector<float> one(rows.size() * V), three(rows.size() * V);
    ThreadPool p1(1), p3(3);
    ASSERT_TRUE((*model)->forward(Context{Device::kCpu, &p1}, k.view(rows), one.data()).ok());
    ASSERT_TRUE((*model)->forward(Context{Device::kCpu, &p3}, k.view(rows), three.data()).ok());
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_TRUE(std::isfinite(one[i])) << "index " << i;
      ASSERT_EQ(one[i], three[i]) << "index " << i;
    }
  }
}

TEST(ForwardParity, ObserverSeesEveryLayer) {
  const auto manifest = dc::testing::load_manifest();
  ASSERT_FALSE(manifest["models"].empty());
  auto model = Model::load(dc::testing::fixtures_dir() + "/" + manifest["models"][0]["dir"].get<std::string>());
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<int64_t> rows = {2};
  ForwardBatch b{1, 3, tokens.data(), nullptr, nullptr, rows.data(), 1};
  std::vector<float> logits((*model)->config().n_vocab);
  std::vector<std::string> names;
  ForwardObserver obs = [&](const std::string& name, const float*, const std::vector<int64_t>& shape) {
    names.push_back(name);
  };
  ThreadPool pool(1);
  ASSERT_TRUE((*model)->forward(Context{Device::kCpu, &pool}, b, logits.data(), &obs).ok());
  EXPECT_EQ(names.front(), "embd");
  EXPECT_EQ(names.back(), "output_norm");
  const int64_t n_layer = (*model)->config().n_layer;
  EXPECT_NE(std::find(names.begin(), names.end(), "L" + std::to_string(n_layer - 1) + ".out"), names.end());
}

TEST(ForwardParity, BadBatchIsRejectedWithTheField) {
  const auto manifest = dc::testing::load_manifest();
  ASSERT_FALSE(manifest["models"].empty());
  auto model = Model::load(dc::testing::fixtures_dir() + "/" + manifest["models"][0]["dir"].get<std::string>());
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  std::vector<int32_t> tokens = {1, 999999, 3};
  std::vector<int64_t> rows = {0};
  std::vector<float> logits((*model)->config().n_vocab);
  ForwardBatch b{1, 3, tokens.data(), nullptr, nullptr, rows.data(), 1};
  Status s = (*model)->forward(Context{Device::kCpu, &pool}, b, logits.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("999999"), std::string::npos) << s.message();
  tokens[1] = 2;
  rows[0] = 3;
  s = (*model)->forward(Context{Device::kCpu, &pool}, b, logits.data());
  EXPECT_NE(s.message().find("out_rows"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace dc
