// The device memory plan of a training run (train/device_training.h plan_device_training, check_device_plan) on
// device 0 (lavapipe in CI): it covers what an SFT step really holds on the device (the backend's count of its
// buffers), with and without gradient checkpointing, and what a GRPO round and its rollout hold, with and without
// --fast's KV cache; under a small device (DC_VULKAN_MEMORY_MIB) a run that would not fit is refused before its
// first step, naming the sizes and the fix that makes it fit. A LoRA run's plan the same way. The 7B shape's plan
// holds one chunk of the loss rows' logits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "gguf/model_source.h"
#include "head_dim_16_policy.h"
#include "model/params.h"
#include "model/synthetic.h"
#include "model/transformer.h"
#include "ops/device.h"
#include "temp_dir.h"
#include "train/device_training.h"
#include "train/grpo_trainer.h"
#include "train/tiny_grpo.h"
#include "train/trainer.h"
#include "vulkan_test_config.h"

namespace dc::train {
namespace {

ModelConfig plan_config() { return testing::vulkan_test_config(4, 2, 16, 96); }

TrainOptions plan_options(bool recompute) {
  TrainOptions o;
  o.seq_len = 64, o.batch_size = 4, o.grad_accum = 1, o.steps = 1;
  o.lr.lr = 1e-3, o.lr.total_steps = 1;
  o.recompute = recompute;
  o.precision = MatmulPrecision::kF32;
  return o;
}

ModelParams plan_params(const ModelConfig& c) {
  ThreadPool pool(2);
  auto synthetic = make_synthetic_model(c, 21, &pool, nullptr);
  EXPECT_TRUE(synthetic.ok());
  return ModelParams::from_weights(c, (*synthetic)->weights()).value();
}

std::unique_ptr<Trainer> plan_trainer(const ModelConfig& c, const TrainOptions& o, const Context& ctx) {
  Dataset d;
  uint64_t state = 9;
  for (int64_t i = 0; i < 8; ++i) {
    TrainSequence s;
    for (int64_t j = 0; j < o.seq_len; ++j) s.tokens.push_back(static_cast<int32_t>(splitmix64_next(state) % 298));
    s.loss_mask.assign(o.seq_len, 1);
    d.sequences.push_back(std::move(s));
  }
  auto t = Trainer::create_with_params(o, ctx, c, plan_params(c), std::move(d));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

// The plan Trainer makes for `o` (its micro-batch: batch_size × seq_len positions, every one a loss row at most),
// with `lora` a LoRA run's over those adapters.
DeviceTrainingPlan sft_plan(const ModelConfig& c, const TrainOptions& o, const LoraParams* lora = nullptr) {
  const ModelParams params = plan_params(c);
  const auto model = Model::from_weights(c, params.weights(), nullptr);
  DeviceBatchShape batch;
  batch.positions = batch.loss_rows = o.batch_size * o.seq_len;
  batch.recompute = o.recompute;
  return plan_device_training(*model, /*optimizer=*/true, /*reference=*/false, batch, lora);
}

// A context computing on `backend` with `pool`.
Context on_device(DeviceBackend* backend, ThreadPool* pool) {
  Context dev;
  dev.pool = pool, dev.device = Device::kVulkan, dev.backend = backend;
  return dev;
}

// Sets DC_VULKAN_MEMORY_MIB for its lifetime.
class MemoryCap {
 public:
  explicit MemoryCap(const std::string& mib) { setenv("DC_VULKAN_MEMORY_MIB", mib.c_str(), 1); }
  ~MemoryCap() { unsetenv("DC_VULKAN_MEMORY_MIB"); }
};

// A full fine-tune's step and a LoRA run's (rank 8 on every projection), each with and without checkpointing: the
// step holds at most the plan and at least 70 % of it. A LoRA run's plan counts the frozen base as stored and the
// adapters, the gradients and moments of the adapters only, and each adapter's u in the activations.
TEST(DevicePlan, CoversWhatAStepHoldsOnTheDevice) {
  const ModelConfig c = plan_config();
  ThreadPool pool(2);
  for (const int lora_r : {0, 8}) {
    for (const bool recompute : {false, true}) {
      SCOPED_TRACE("lora_r " + std::to_string(lora_r) + ", recompute " + std::to_string(recompute));
      auto backend = open_vulkan_backend(0);
      ASSERT_TRUE(backend.ok()) << backend.status().to_string();
      const Context dev = on_device(backend->get(), &pool);
      TrainOptions o = plan_options(recompute);
      o.lora.r = lora_r;
      auto t = plan_trainer(c, o, dev);
      ASSERT_TRUE(t != nullptr);
      const int64_t before = (*backend)->counters().device_bytes;  // the backend's own (kernels' fixed scratch)
      auto s = t->step();
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      const int64_t held = (*backend)->counters().device_peak_bytes - before;
      const LoraParams* adapters = lora_r > 0 ? &t->lora()->params() : nullptr;
      const DeviceTrainingPlan plan = sft_plan(c, o, adapters);
      if (adapters != nullptr) {
        const int64_t adapter_bytes = adapters->n_values() * 4;
        EXPECT_EQ(plan.gradients, adapter_bytes);
        EXPECT_EQ(plan.moments, 2 * adapter_bytes);
        EXPECT_EQ(plan.weights, plan_params(c).n_values() * 4 + adapter_bytes);
        EXPECT_GT(plan.activations, sft_plan(c, plan_options(recompute)).activations) << "each adapter's u";
      }
      std::printf("  lora_r %d, recompute %d: the step held at most %lld bytes, the plan %lld (activations %lld)\n",
                  lora_r, recompute, static_cast<long long>(held), static_cast<long long>(plan.total()),
                  static_cast<long long>(plan.activations));
      EXPECT_LE(held, plan.total()) << "the plan misses part of the device's need";
      EXPECT_GE(held, plan.total() * 7 / 10) << "the plan is far above the need";
      t.reset();
    }
  }
  EXPECT_LT(sft_plan(c, plan_options(true)).activations, sft_plan(c, plan_options(false)).activations);
}

// The shape `grpo` plans a round by (prompts_per_round · G rows of max_prompt_length + max_completion_length
// positions; a micro-batch's rows in three coupled versions, a completion position scored twice), written out here
// from the options rather than read from the trainer, so that a trainer planning another shape fails the test.
DeviceBatchShape grpo_shape(const GrpoOptions& o) {
  const int64_t rows = o.prompts_per_round * o.group_size, micro_rows = rows / o.grad_accum;
  const int64_t C = o.max_completion_length, S = o.max_prompt_length + C;
  DeviceBatchShape b;
  b.positions = 3 * micro_rows * S, b.loss_rows = 2 * micro_rows * C, b.recompute = o.recompute;
  b.rollout_positions = rows * S, b.rollout_sampled = rows * C;
  if (o.rollout_kv_cache) b.rollout_kv_rows = rows, b.rollout_kv_seq = S;
  return b;
}

// `rollout` with the device memory its first call took on top of what was held when it began (the rollout's own
// buffers: the forward's, the head sampler's rows, with --fast the KV cache) into *grown.
RolloutFn measured(RolloutFn rollout, const DeviceBackend* backend, int64_t* grown) {
  return [=](const Context& ctx, const Model& policy, int64_t round, const std::vector<int64_t>& prompts) {
    const int64_t at_start = backend->counters().device_bytes;
    auto r = rollout(ctx, policy, round, prompts);
    if (*grown < 0) *grown = backend->counters().device_peak_bytes - at_start;
    return r;
  };
}

// One GRPO round on the device, its rollouts generated as `grpo` generates them (generate_on_model: the head samples
// on the device; with --fast, blocks over a dual KV cache on the device) and its two optimizer steps with the
// reference model there. Two counts against the plan (the backend's buffers before the first step, its kernels'
// fixed scratch, left out as the plan leaves them out; the transfers' staging buffers are host memory, not in
// device_bytes):
// - the round's peak is at most the plan's total and at least 70 % of it less the rollouts' part (the plan adds
//   the rollouts' sampled rows and KV cache to the training's although a round holds them at different times);
// - the first rollout's own buffers (the first, so the forward's named buffers are new) are at most the plan's
//   rollout part with the forward's buffers at the rollout's positions, and at least half of it (the plan is above
//   the need where --fast's blocks are shorter than the completion, each step sampling one block's rows, and where
//   the KV cache holds the keys and values the forward's buffers are also counted for). Here --fast decodes one
//   block of the completion, so that a plan without the KV cache falls short of the rollout's need.
TEST(DevicePlan, CoversWhatAGrpoRoundHoldsOnTheDevice) {
  ASSERT_TRUE(std::filesystem::exists(kGrpoDir / ".complete")) << "run `ctest -R grpo_fixtures` first";
  test::TempDir dir("device_plan_grpo");
  const std::string model_dir = head_dim_16_policy(dir.path());
  ModelConfig config;
  auto params = load_trainable_params(model_dir, &config);
  ASSERT_TRUE(params.ok()) << params.status().to_string();
  const auto model = Model::from_weights(config, params->weights(), nullptr);
  constexpr int64_t kCompletion = 8, kGroup = 8;
  ThreadPool pool(2);
  for (const bool fast : {false, true}) {
    auto backend = open_vulkan_backend(0);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    const Context dev = on_device(backend->get(), &pool);
    GrpoOptions o = tiny_grpo_options(2);  // one round of two iterations
    o.model_dir = model_dir;
    o.group_size = kGroup, o.max_prompt_length = 3, o.max_completion_length = kCompletion;  // tiny_prompts: 3 ids
    o.rollout_kv_cache = fast;
    ASSERT_GT(o.loss.beta, 0) << "the test wants the reference model on the device";
    int64_t rollout_grown = -1;
    auto t = GrpoTrainer::create(o, dev, measured(engine_rollout(kGroup, kCompletion, 7, fast), backend->get(), &rollout_grown));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const int64_t before = (*backend)->counters().device_bytes;
    while ((*t)->steps_done() < o.steps) {
      auto s = (*t)->step();
      ASSERT_TRUE(s.ok()) << s.status().to_string();
    }
    const int64_t held = (*backend)->counters().device_peak_bytes - before;
    const DeviceBatchShape shape = grpo_shape(o);
    const DeviceTrainingPlan plan = plan_device_training(*model, /*optimizer=*/true, /*reference=*/true, shape);
    const int64_t rollout_plan = model->forward_bytes_per_position() * shape.rollout_positions + plan.rollouts;
    std::printf("  fast %d: the round held at most %lld bytes, the plan %lld (%s); the rollout took %lld, its part of the "
                "plan %lld\n", fast, static_cast<long long>(held), static_cast<long long>(plan.total()), plan.text().c_str(),
                static_cast<long long>(rollout_grown), static_cast<long long>(rollout_plan));
    EXPECT_LE(held, plan.total()) << "fast " << fast << ": the plan misses part of the device's need";
    EXPECT_GE(held, (plan.total() - plan.rollouts) * 7 / 10) << "fast " << fast << ": the plan is far above the need";
    EXPECT_LE(rollout_grown, rollout_plan) << "fast " << fast << ": the plan misses part of the rollout's need";
    EXPECT_GE(rollout_grown, rollout_plan / 2) << "fast " << fast << ": the plan is far above the rollout's need";
    t->reset();
  }
}

// A device between the checkpointed run's plan and the full one's: the full run is refused at start, naming the
// sizes and --grad-checkpointing as the fix that fits; the checkpointed run trains there.
TEST(DevicePlan, RefusesARunThatDoesNotFitNamingTheFix) {
  const ModelConfig c = plan_config();
  const int64_t full = sft_plan(c, plan_options(false)).total(), checkpointed = sft_plan(c, plan_options(true)).total();
  ASSERT_LT(checkpointed, full);
  const MemoryCap cap(std::to_string(static_cast<double>(checkpointed + full) / 2 / (1 << 20)));
  ThreadPool pool(2);
  for (const bool recompute : {false, true}) {
    auto backend = open_vulkan_backend(0);
    ASSERT_TRUE(backend.ok()) << backend.status().to_string();
    ASSERT_LT((*backend)->memory_bytes(), full);
    const Context dev = on_device(backend->get(), &pool);
    auto t = plan_trainer(c, plan_options(recompute), dev);
    ASSERT_TRUE(t != nullptr);
    auto s = t->step();
    if (recompute) {
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      continue;
    }
    ASSERT_FALSE(s.ok());
    const std::string m = s.status().message();
    std::printf("  refused: %s\n", m.c_str());
    EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << m;
    for (const char* part : {"activations", "working buffers", "loss rows", "Adam moments", "--grad-checkpointing", "which fits",
                             "--batch-size", "--lora-r", "--device cpu"})
      EXPECT_NE(m.find(part), std::string::npos) << "the refusal does not say '" << part << "': " << m;
    EXPECT_EQ(t->steps_done(), 0);
  }
}

// A model of `config` with its shapes only (bf16 matrices as a checkpoint stores them, without data; f32 vectors in
// `store`): what plan_device_training reads, for a shape too large to build (the 7B one).
std::unique_ptr<Model> shape_only_model(const ModelConfig& config, VectorStore& store) {
  ModelWeights w;
  visit_weights(config, w, [&](const WeightSlot& slot) {
    if (slot.matrix != nullptr) *slot.matrix = WeightView{DType::kBF16, nullptr, slot.shape[0], slot.shape[1]};
    if (slot.vector != nullptr) *slot.vector = store.take(slot.shape[0]);
  });
  return Model::from_weights(config, std::move(w), nullptr);
}

// The 7B shape's plan at 8 sequences of 2048 positions, half of them loss rows (8192): the loss rows hold their
// hidden states and one chunk of 384 rows' logits (DeviceLossRows::default_chunk_rows), not the 8192 rows' 5 GB.
// Printed before (every row's logits, the plan of the unchunked head) and after, for docs/train.md.
TEST(DevicePlan, TheSevenBShapeHoldsOneChunkOfLogits) {
  const ModelConfig c = synthetic_config("diffucoder-7b").value();
  VectorStore store(c);
  const auto model = shape_only_model(c, store);
  DeviceBatchShape batch;
  batch.positions = 8 * 2048, batch.loss_rows = 8192, batch.recompute = true;
  const int64_t chunk = DeviceLossRows::default_chunk_rows(c.n_vocab);
  EXPECT_EQ(chunk, 384);
  const int64_t all_logits = batch.loss_rows * c.n_vocab * 4;
  LoraSpec spec;
  spec.r = 16;
  const LoraParams adapters = LoraParams::zeros(c, spec);
  for (const LoraParams* lora : {static_cast<const LoraParams*>(nullptr), &adapters}) {
    const DeviceTrainingPlan plan = plan_device_training(*model, /*optimizer=*/true, /*reference=*/false, batch, lora);
    const int64_t rows = batch.loss_rows * c.n_embd * 4, one_chunk = chunk * c.n_vocab * 4;
    EXPECT_GE(plan.loss_rows, rows + one_chunk);
    EXPECT_LE(plan.loss_rows, rows + one_chunk + chunk * 2 * c.n_embd * 4 + (int64_t{1} << 20)) << "one chunk's logits, not more";
    // The unchunked head's plan: every row's logits, and the backward's dnorm [n_out, E] (backward_bytes' from dlogits).
    const int64_t unchunked = plan.total() - plan.loss_rows + rows + all_logits +
                              model->backward_bytes(batch.positions, batch.loss_rows, true) -
                              model->backward_bytes(batch.positions, batch.loss_rows, true, /*from_hidden=*/true);
    const double gib = 1 << 30;
    std::printf("  7B %s, 8 x 2048 positions, 8192 loss rows, --grad-checkpointing: %s\n    loss rows %.2f GiB, %.2f GiB in all; "
                "unchunked (every row's logits at once): loss rows %.2f GiB, %.2f GiB in all\n",
                lora != nullptr ? "LoRA r 16 (all projections)" : "full fine-tune", plan.text().c_str(), plan.loss_rows / gib,
                plan.total() / gib, (rows + all_logits) / gib, unchunked / gib);
  }
}

TEST(DevicePlan, ABadMemoryCapIsRefusedByName) {
  for (const char* bad : {"abc", "0", "-1", "1e12"}) {
    const MemoryCap cap(bad);
    auto backend = open_vulkan_backend(0);
    ASSERT_FALSE(backend.ok()) << bad;
    EXPECT_NE(backend.status().message().find("DC_VULKAN_MEMORY_MIB"), std::string::npos) << backend.status().message();
  }
}

}  // namespace
}  // namespace dc::train
