// DeviceLossRows (train/device_training.h) on device 0 (lavapipe in CI): the lm_head, the cross-entropy and the
// head's backward in chunks of rows, forced to 3 rows so that a tiny batch runs several chunks and a tail, against
// one chunk of every row (the default at this vocabulary) and the CPU (reference kernels): the SFT loss and every
// gradient of a full fine-tune (written over stale values, then added; tied and untied embeddings) and of a LoRA
// run, and Coupled-GRPO's log-probs, loss and gradients. And the memory plan of the 7B shape, one chunk of logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "devices.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "relative_distance.h"
#include "train/device_sft.h"
#include "train/device_training.h"
#include "train/grpo_loss.h"
#include "train/lora_core.h"
#include "train/trainer.h"
#include "vulkan_test_config.h"

namespace dc::train {
namespace {

constexpr int64_t kForcedChunk = 3;  // rows: 19 to 30 loss rows make 7 to 10 chunks, the last of 1 or 2 rows
// Chunked against one chunk: not bit for bit (a chunk's lm_head products run over its own rows, the GEMM's kernel
// and tiles chosen by that count, matvec up to 8 rows; the lm_head's dW adds the chunks' products), so within f32
// rounding: each gradient within 1e-6 relative (expect_close).

// Each of got's tensors against want's: max |Δ| within `bound` of max |want|, but for the K projections' biases,
// whose gradient is zero in exact arithmetic (a shift of every key by the same vector leaves each query's softmax
// as it is), so that theirs is rounding noise: within `bound` of the largest |want| of the model. The worst ratio.
double expect_close(const ModelParams& got, const ModelParams& want, double bound, const std::string& what) {
  double largest = 0;
  for (int64_t i = 0; i < want.n_values(); ++i) largest = std::max(largest, std::abs(static_cast<double>(want.data()[i])));
  double worst = 0;
  for (size_t t = 0; t < want.tensors().size(); ++t) {
    const ModelParams::Tensor& w = want.tensors()[t];
    const bool k_bias = w.name.find("k_proj.bias") != std::string::npos;
    double r = relative_distance(got.tensors()[t].data, w.data, w.size);
    if (k_bias) {
      const double own = *std::max_element(w.data, w.data + w.size, [](float a, float b) { return std::abs(a) < std::abs(b); });
      r *= std::abs(own) / largest;
    }
    EXPECT_LE(r, bound) << what << ": " << w.name;
    worst = std::max(worst, r);
  }
  return worst;
}

// B × L random ids below 298 (the mask id), about half masked: each masked position j > 0 a loss row (b·L + j − 1)
// with its clean id as target and a weight in [0.25, 1.25).
MaskedBatch masked_batch(int64_t B, int64_t L, uint64_t seed) {
  MaskedBatch m;
  m.n_batch = B, m.n_seq = L;
  uint64_t state = seed;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < L; ++j) {
      const auto id = static_cast<int32_t>(splitmix64_next(state) % 298);
      const bool masked = j > 0 && splitmix64_next(state) % 2 == 0;
      m.tokens.push_back(masked ? 298 : id);
      if (!masked) continue;
      m.out_rows.push_back(b * L + j - 1);
      m.targets.push_back(id);
      m.weights.push_back(0.25f + static_cast<float>(splitmix64_next(state) % 1000) / 1000.0f);
    }
  return m;
}

DeviceBatchShape shape_of(const MaskedBatch& m) {
  DeviceBatchShape s;
  s.positions = m.n_batch * m.n_seq, s.loss_rows = static_cast<int64_t>(m.out_rows.size());
  return s;
}

// Gradients of random values: what a kOverwrite must not read.
ModelParams stale_gradients(const ModelConfig& c) {
  ModelParams g = ModelParams::zeros(c);
  uint64_t state = 3;
  for (int64_t i = 0; i < g.n_values(); ++i) g.data()[i] = static_cast<float>(splitmix64_next(state) % 1000) - 500.0f;
  return g;
}

// reserve() holds the n_out rows' hidden states and one chunk's rows, their gradient and logits (what the plan
// counts), not the n_out rows' logits; the default chunk is 256 MiB of logits in rows of 64.
TEST(DeviceLossRows, ReserveHoldsOneChunkOfLogits) {
  EXPECT_EQ(DeviceLossRows::default_chunk_rows(152064), 384);
  EXPECT_EQ(DeviceLossRows::default_chunk_rows(4096), 16384);
  EXPECT_EQ(DeviceLossRows::default_chunk_rows(int64_t{1} << 24), 64) << "at least 64 rows";
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  const int64_t n_out = 100, E = c.n_embd, V = c.n_vocab;
  DeviceLossRows rows;
  rows.set_chunk_rows(kForcedChunk);
  const int64_t before = d.backend->counters().device_bytes;
  ASSERT_TRUE(rows.reserve(d.dev, c, n_out).ok());
  const int64_t held = d.backend->counters().device_bytes - before;
  const int64_t want = (n_out * E + kForcedChunk * (2 * E + V)) * 4;
  EXPECT_GE(held, want);
  EXPECT_LE(held, want + 4 * 256) << "more than one chunk's buffers (a few words of alignment each)";
  EXPECT_LT(held, n_out * V * 4) << "the rows' logits";
}

// Two micro-batches (the first written over stale gradients, the second added, scaled by 1/2) on the CPU and on the
// device with one chunk and with 3-row chunks: the losses and every gradient. The chunks change only the order of
// the lm_head gradient's sums over rows (and which GEMM kernel a chunk of <= 8 rows takes), so against one chunk
// they agree within f32 rounding (1e-6 relative); both within the device tests' 1e-5 of the CPU.
TEST(DeviceLossRows, SftChunksMatchOneChunkAndTheCpu) {
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  const MaskedBatch batches[2] = {masked_batch(2, 24, 5), masked_batch(2, 24, 6)};
  ASSERT_GT(batches[0].out_rows.size(), 4 * kForcedChunk);
  ASSERT_NE(batches[0].out_rows.size() % kForcedChunk, 0u) << "the test wants a tail chunk";
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied");
    ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
    c.tie_word_embeddings = tied;
    auto synthetic = make_synthetic_model(c, 21, &d.pool, nullptr);
    ASSERT_TRUE(synthetic.ok());
    const ModelParams params = ModelParams::from_weights(c, (*synthetic)->weights()).value();
    const auto model = Model::from_weights(c, params.weights(), nullptr);
    ModelParams want = stale_gradients(c);
    double want_loss[2];
    for (int i = 0; i < 2; ++i) {
      Activations acts;
      auto loss = loss_and_grads(d.cpu, *model, batches[i], 0.5f, want, acts, nullptr, nullptr,
                                 i == 0 ? GradWrite::kOverwrite : GradWrite::kAdd);
      ASSERT_TRUE(loss.ok()) << loss.status().to_string();
      want_loss[i] = *loss;
    }
    ModelParams got[2] = {ModelParams::zeros(c), ModelParams::zeros(c)};  // one chunk, 3-row chunks
    for (const int64_t chunk : {int64_t{0}, kForcedChunk}) {
      auto device = DeviceTraining::start(d.dev, *model, nullptr, shape_of(batches[0]));
      ASSERT_TRUE(device.ok()) << device.status().to_string();
      (*device)->rows().set_chunk_rows(chunk);
      ASSERT_TRUE((*device)->grads().upload(d.dev, stale_gradients(c)).ok());
      for (int i = 0; i < 2; ++i) {
        Activations acts;
        auto loss = device_loss_and_grads(d.dev, *model, batches[i], 0.5f, acts,
                                          i == 0 ? GradWrite::kOverwrite : GradWrite::kAdd, nullptr, **device);
        ASSERT_TRUE(loss.ok()) << loss.status().to_string();
        EXPECT_NEAR(*loss, want_loss[i], 1e-5 * want_loss[i]) << "chunk " << chunk << ", micro-batch " << i;
      }
      ModelParams& g = got[chunk == 0 ? 0 : 1];
      ASSERT_TRUE((*device)->grads().download(d.dev, g).ok());
    }
    const double to_one = expect_close(got[1], got[0], 1e-6, "3-row chunks against one chunk");
    expect_close(got[0], want, 1e-5, "one chunk against the CPU");
    const double to_cpu = expect_close(got[1], want, 1e-5, "3-row chunks against the CPU");
    std::printf("  %s: gradients of 3-row chunks against one chunk %.2e, against the CPU %.2e\n", tied ? "tied" : "untied",
                to_one, to_cpu);
  }
}

// A LoRA run's adapters (rank 4 on every projection, B drawn non-zero so that A's gradient is too) over a frozen
// base: the head's backward gives the hidden rows' gradient only.
TEST(DeviceLossRows, LoraChunksMatchOneChunkAndTheCpu) {
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  auto model = make_synthetic_model(c, 21, &d.pool, nullptr);
  ASSERT_TRUE(model.ok());
  const ModelParams params = ModelParams::from_weights(c, (*model)->weights()).value();
  const auto base = Model::from_weights(c, params.weights(), nullptr);
  LoraSpec spec;
  spec.r = 4, spec.alpha = 8;
  OptimizerOptions o;
  LoraCore core = LoraCore::start(c, spec, 9, o);
  LoraParams& adapters = core.host_state().params;
  uint64_t state = 17;
  for (int64_t i = 0; i < adapters.n_values(); ++i)  // each B (PEFT's zeros) drawn
    if (adapters.data()[i] == 0) adapters.data()[i] = (static_cast<float>(splitmix64_next(state) % 1000) / 1000.0f - 0.5f) * 0.1f;
  const MaskedBatch batch = masked_batch(2, 24, 7);
  LoraParams want = LoraParams::zeros_like(core.params());
  Activations cpu_acts;
  auto want_loss = loss_and_lora_grads(d.cpu, *base, batch, 1.0f, core.params().weights(), want, cpu_acts);
  ASSERT_TRUE(want_loss.ok()) << want_loss.status().to_string();
  std::vector<LoraParams> got;
  for (const int64_t chunk : {int64_t{0}, kForcedChunk}) {
    auto device = DeviceLoraTraining::start(d.dev, *base, core, shape_of(batch));
    ASSERT_TRUE(device.ok()) << device.status().to_string();
    (*device)->rows().set_chunk_rows(chunk);
    Activations acts;
    auto loss = device_lora_loss_and_grads(d.dev, *base, batch, 1.0f, core.params().weights(), acts, nullptr, **device);
    ASSERT_TRUE(loss.ok()) << loss.status().to_string();
    EXPECT_NEAR(*loss, *want_loss, 1e-5 * *want_loss) << "chunk " << chunk;
    got.push_back(LoraParams::zeros_like(core.params()));
    ASSERT_TRUE((*device)->grads().download(d.dev, got.back()).ok());
  }
  double to_one = 0, to_cpu = 0;
  for (size_t t = 0; t < want.tensors().size(); ++t) {
    const LoraParams::Tensor& w = want.tensors()[t];
    const float* chunked = got[1].data() + w.offset;
    const double one = relative_distance(chunked, got[0].data() + w.offset, w.size);
    const double cpu = relative_distance(chunked, want.data() + w.offset, w.size);
    EXPECT_LE(one, 1e-6) << w.name;
    EXPECT_LE(cpu, 1e-5) << w.name;
    to_one = std::max(to_one, one), to_cpu = std::max(to_cpu, cpu);
  }
  std::printf("  LoRA: adapters' gradients of 3-row chunks against one chunk %.2e, against the CPU %.2e\n", to_one, to_cpu);
}

// Coupled-GRPO: the reference's log-probs (coupled_logps) and the loss with its gradient (clipping on, a KL term)
// with one chunk and with 3-row chunks (the second pass runs the lm_head again per chunk), against the CPU.
TEST(DeviceLossRows, GrpoChunksMatchOneChunkAndTheCpu) {
  const ModelConfig c = testing::vulkan_test_config(4, 2, 16, 96);
  Devices d;
  ASSERT_NE(d.backend, nullptr);
  auto policy = make_synthetic_model(c, 31, &d.pool, nullptr).value();
  const ModelParams params = ModelParams::from_weights(c, policy->weights()).value();
  const auto model = Model::from_weights(c, params.weights(), nullptr);
  GrpoBatch batch;
  batch.n_batch = 4, batch.n_prompt = 3, batch.n_completion = 5;
  uint64_t state = 7;
  for (int64_t i = 0; i < 12; ++i) batch.prompt_ids.push_back(static_cast<int32_t>(splitmix64_next(state) % 298));
  for (int64_t i = 0; i < 20; ++i) batch.completion_ids.push_back(static_cast<int32_t>(splitmix64_next(state) % 298));
  batch.completion_mask.assign(20, 1);
  batch.completion_mask[19] = 0;
  auto rows = coupled_rows(batch, draw_coupled_mask(4, 5, 11), 298, c.n_vocab, false);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  ASSERT_NE(rows->out_rows.size() % kForcedChunk, 0u) << "the test wants a tail chunk";
  auto old = coupled_logps(d.cpu, *model, *rows, batch.n_completion);
  ASSERT_TRUE(old.ok());
  GrpoLossInputs in;
  in.batch = &batch, in.rows = &*rows, in.advantages = {1.5, -0.5, 0.25, -1.25};
  in.old_logps = *old, in.ref_logps = *old;
  for (size_t i = 0; i < old->size(); ++i) in.old_logps[i] += i % 2 == 0 ? 0.4f : -0.4f, in.ref_logps[i] -= 0.1f;
  GrpoLossOptions o;
  o.beta = 0.3, o.epsilon = 0.2;
  ModelParams want = ModelParams::zeros(c);
  Activations cpu_acts;
  auto w = grpo_loss_and_grads(d.cpu, *model, in, o, 0.5f, want, cpu_acts, nullptr, GradWrite::kOverwrite);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_GT(w->clip_fraction, 0.0) << "the test wants clipping on";
  DeviceBatchShape shape;
  shape.positions = rows->n_batch * rows->n_seq, shape.loss_rows = static_cast<int64_t>(rows->out_rows.size());
  std::vector<ModelParams> got;
  std::vector<std::vector<float>> logps;
  for (const int64_t chunk : {int64_t{0}, kForcedChunk}) {
    auto device = DeviceTraining::start(d.dev, *model, nullptr, shape);
    ASSERT_TRUE(device.ok()) << device.status().to_string();
    (*device)->rows().set_chunk_rows(chunk);
    auto dev_logps = coupled_logps(d.dev, *model, *rows, batch.n_completion, &(*device)->rows());
    ASSERT_TRUE(dev_logps.ok()) << dev_logps.status().to_string();
    EXPECT_LE(relative_distance(dev_logps->data(), old->data(), static_cast<int64_t>(old->size())), 1e-5) << chunk;
    logps.push_back(*dev_logps);
    ASSERT_TRUE((*device)->grads().upload(d.dev, stale_gradients(c)).ok());
    Activations acts;
    auto g = grpo_loss_and_device_grads(d.dev, *model, in, o, 0.5f, **device, acts, GradWrite::kOverwrite);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    EXPECT_NEAR(g->loss, w->loss, 1e-5 * std::abs(w->loss)) << "chunk " << chunk;
    EXPECT_NEAR(g->kl, w->kl, 1e-5 * w->kl) << "chunk " << chunk;
    EXPECT_EQ(g->clip_fraction, w->clip_fraction) << "chunk " << chunk;
    got.push_back(ModelParams::zeros(c));
    ASSERT_TRUE((*device)->grads().download(d.dev, got.back()).ok());
  }
  EXPECT_LE(relative_distance(logps[1].data(), logps[0].data(), static_cast<int64_t>(logps[0].size())), 1e-6);
  const double to_one = expect_close(got[1], got[0], 1e-6, "3-row chunks against one chunk");
  const double to_cpu = expect_close(got[1], want, 1e-5, "3-row chunks against the CPU");
  std::printf("  GRPO: gradients of 3-row chunks against one chunk %.2e, against the CPU %.2e\n", to_one, to_cpu);
}

}  // namespace
}  // namespace dc::train
