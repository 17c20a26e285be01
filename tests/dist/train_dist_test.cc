// `mpirun -np 2 diffucoder train` against one process over loopback (registered only when MPI is built):
// 2 ranks equal 1 rank with the same accumulation over 20 steps (losses and final weights within 1e-6
// relative) while each rank holds half the optimizer state and of the reduced gradients (ZeRO-2: besides,
// two layers' slots, the embedding table's (an untied lm_head's shares it) and the final norm; five layers
// reuse the two slots while their reductions travel; several micro-batches per rank reduced once per step
// equal the per-micro-batch reduction); a rerun is bit-identical; a killed rank ends
// the job with a message on the survivor and no partial checkpoint, and the run resumes bit-exact on 2
// ranks and correctly on 1 (the moments re-sharded). Seven short runs in all (~50 s on a loaded 2-core CI).
// In bf16 mixed precision each rank keeps the f32 masters of its shard only (counted), with the same
// results and resumes, tied embeddings too (two runs of a tied copy of the checkpoint).
// Coupled-GRPO the same way: with fixed rollouts (grpo_dist_check) 2 ranks equal one process, a rerun of
// the first round resumed for the second is bit-identical; `mpirun -np 2 diffucoder grpo` runs end to end with rank 0's progress.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/comm.h"
#include "train_dist.h"

namespace dc {
namespace {

constexpr int kSteps = 20;

void expect_within(const fs::path& a, const fs::path& b, double tolerance) {
  const Difference d = difference(a, b);
  EXPECT_LT(d.norm_relative, tolerance) << a << " vs " << b;
  EXPECT_LT(d.max_relative, tolerance) << a << " vs " << b;
}

void expect_close_curves(const std::vector<double>& a, const std::vector<double>& b, size_t n_steps) {
  ASSERT_EQ(a.size(), n_steps);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * std::fabs(a[i])) << "step " << i + 1;
}

const char* kFinal = "checkpoint-000020";

// Runs a and b (output directories) of n_steps: the final weights (checkpoint `last`) within 1e-6 and the
// loss curves within 1e-6 relative.
void expect_same_run(const fs::path& a, const fs::path& b, const char* last, size_t n_steps) {
  expect_within(a / last / "model.safetensors", b / last / "model.safetensors", 1e-6);
  expect_close_curves(losses(a / "metrics.jsonl"), losses(b / "metrics.jsonl"), n_steps);
}

// The summary line of a run's output only: under mpirun, launcher notices may follow it on stdout.
nlohmann::json summary(const std::string& out) {
  const size_t at = out.rfind("{\"steps\"");
  return nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
}

// The parameters of a checkpoint's model.safetensors: all, and the f32 ones the forward reads in mixed
// precision (the embedding table, norm weights, biases; the other matrices it reads as bf16 copies).
struct ParamCounts {
  int64_t all = 0, in_layers = 0, read_in_f32 = 0, table = 0, lm_head = 0;  // table: the embedding table
};
ParamCounts param_counts(const fs::path& model) {
  ParamCounts c;
  auto file = SafetensorsFile::open(model.string());
  EXPECT_TRUE(file.ok()) << model;
  if (!file.ok()) return c;
  for (const auto& [name, t] : file->tensors()) {
    const int64_t n = static_cast<int64_t>(t.n_bytes / sizeof(float));
    c.all += n;
    if (name.rfind("model.layers.", 0) == 0) c.in_layers += n;
    if (t.shape.size() == 1 || name == "model.embed_tokens.weight") c.read_in_f32 += n;
    if (name == "model.embed_tokens.weight") c.table = n;
    if (name == "lm_head.weight") c.lm_head = n;
  }
  return c;
}

TEST_F(TrainDist, TwoRanksEqualOneRankWithHalfTheOptimizerStateEach) {
  const auto one = train(1, "one");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = train(2, "two");
  ASSERT_EQ(two.exit_code, 0) << two.out;
  expect_same_run(path("one"), path("two"), kFinal, kSteps);
  // The moments: the two shards, laid end to end, are the unsharded run's (within float rounding).
  auto whole = SafetensorsFile::open((path("one") / kFinal / "optimizer.safetensors").string());
  ASSERT_TRUE(whole.ok());
  int64_t whole_values = 0;
  for (const auto& [name, t] : whole->tensors()) whole_values += static_cast<int64_t>(t.n_bytes / sizeof(float));
  int64_t shard_values = 0;
  for (int r = 0; r < 2; ++r) {
    const fs::path f = path("two") / kFinal / ("optimizer-rank0000" + std::to_string(r) + "-of-00002.safetensors");
    auto shard = SafetensorsFile::open(f.string());
    ASSERT_TRUE(shard.ok()) << f;
    const TensorInfo* m = shard->find("m");
    ASSERT_NE(m, nullptr);
    shard_values += 2 * m->shape[0];
    // measured: each rank's file holds half of the moments' bytes (to the header)
    EXPECT_NEAR(static_cast<double>(shard->file_size()), whole->file_size() / 2.0, 0.01 * whole->file_size()) << f;
  }
  EXPECT_EQ(shard_values, whole_values);
  // The ranks' own count of the moments they hold: half of one process's each.
  const auto j1 = summary(one.out);
  const auto j2 = summary(two.out);
  EXPECT_EQ(j2["ranks"], 2);
  const int64_t full = j1["optimizer_state_bytes"][0];
  EXPECT_EQ(full, whole_values * 4);
  EXPECT_EQ(j2["optimizer_state_bytes"][0].get<int64_t>() + j2["optimizer_state_bytes"][1].get<int64_t>(), full);
  EXPECT_GT(j2["bytes_sent_per_step"][0].get<double>(), 0.9 * full / 2);  // half the gradients out, half the weights
  EXPECT_EQ(j2["peak_rss_bytes"].size(), 2u);
  // ZeRO-2, the gradients each rank holds, counted: its 1/2 shard of the reduced gradients, two layers'
  // slots (one written while the other is sent: here all of the 2 layers), one embedding table's (the
  // lm_head's shares it) and the final norm — not one process's whole buffer.
  const ParamCounts counts = param_counts(path("one") / kFinal / "model.safetensors");
  const int64_t n_params = counts.all;
  ASSERT_GT(counts.lm_head, 0);
  EXPECT_EQ(j1["gradient_bytes"][0].get<int64_t>(), 4 * n_params);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(j2["gradient_bytes"][r].get<int64_t>(),
              4 * (n_params - counts.lm_head + dist::shard_range(n_params, r, 2).size()))
        << "rank " << r;

  // The same run again, where rank 1 dies after step 12: the job ends with a message on rank 0; the last
  // checkpoint is step 10's — the first run's bit for bit (a rerun on 2 ranks is bit-identical) — and no
  // later one, complete or partial, is there.
  const auto cut = train(2, "cut", "--exit-after-step 12 --exit-rank 1");
  EXPECT_NE(cut.exit_code, 0) << cut.out;
  // (stopped by the launcher's SIGTERM while it waits, or by SIGPIPE while it sends to the dead rank)
  EXPECT_TRUE(cut.out.find("rank 0: stopped by the MPI launcher") != std::string::npos ||
              cut.out.find("rank 0: its connection to another rank broke") != std::string::npos) << cut.out;
  const char* kMid = "checkpoint-000010";
  for (const char* f : {"model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                        "optimizer-rank00001-of-00002.safetensors"})
    EXPECT_TRUE(read_bytes(path("two") / kMid / f) == read_bytes(path("cut") / kMid / f)) << f;
  for (const auto& e : fs::directory_iterator(path("cut")))
    EXPECT_TRUE(e.path().filename() == kMid || !fs::is_directory(e.path())) << e.path();
  fs::copy(path("cut"), path("cut_onto_one"), fs::copy_options::recursive);
  // Resumed on 2 ranks: the uninterrupted run bit for bit (its whole loss curve too).
  const auto resumed = train(2, "cut", "--resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : {"model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                        "optimizer-rank00001-of-00002.safetensors"})
    EXPECT_TRUE(read_bytes(path("two") / kFinal / f) == read_bytes(path("cut") / kFinal / f)) << f;
  EXPECT_EQ(losses(path("two/metrics.jsonl")), losses(path("cut/metrics.jsonl")));
  // Resumed on 1 process from the 2 ranks' checkpoint: the moments re-sharded, the same run within rounding.
  const auto onto_one = train(1, "cut_onto_one", "--resume");
  ASSERT_EQ(onto_one.exit_code, 0) << onto_one.out;
  expect_same_run(path("two"), path("cut_onto_one"), kFinal, kSteps);
  expect_within(path("one") / kFinal / "optimizer.safetensors", path("cut_onto_one") / kFinal / "optimizer.safetensors",
                1e-5);
}

// LoRA adapters on 2 ranks (the gradients summed in rank order, every rank the whole adapter state): the
// same run as one process within rounding (weights of the PEFT adapter and the loss curve), each rank holding
// the adapter's moments whole, and a resume on 2 ranks bit for bit.
TEST_F(TrainDist, LoraOnTwoRanksEqualsOneProcess) {
  const std::string run = "--steps 6 --precision f32 --save-every 3 --lora-r 4 --lora-alpha 8 --lora-dropout 0.1";
  const auto one = train(1, "lora_one", "", 2, run);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = train(2, "lora_two", "", 2, run);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  const char* last = "checkpoint-000006";
  expect_within(path("lora_one") / last / "adapter_model.safetensors", path("lora_two") / last / "adapter_model.safetensors",
                1e-5);
  expect_close_curves(losses(path("lora_one") / "metrics.jsonl"), losses(path("lora_two") / "metrics.jsonl"), 6);
  const auto j1 = summary(one.out);
  const auto j2 = summary(two.out);
  EXPECT_EQ(j2["optimizer_state_bytes"][0], j1["optimizer_state_bytes"][0]) << "each rank holds the adapter's moments whole";
  EXPECT_EQ(j2["optimizer_state_bytes"][1], j1["optimizer_state_bytes"][0]);
  // Killed after step 4 (the checkpoint of step 3 is the newest), resumed on 2 ranks: bit for bit.
  const auto cut = train(2, "lora_cut", "--exit-after-step 4 --exit-rank 1", 2, run);
  EXPECT_NE(cut.exit_code, 0) << cut.out;
  const auto resumed = train(2, "lora_cut", "--resume", 2, run);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : {"adapter_model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_bytes(path("lora_two") / last / f) == read_bytes(path("lora_cut") / last / f)) << f;
}

// bf16 mixed precision on 2 ranks: each rank keeps the f32 masters of its shard (and, whole, those the
// forward reads in f32), the matrices coming back as bf16 copies from the all-gather; the same run as one
// process (here bit for bit in the losses over these 3 steps), checkpoints of the full f32 weights, and a
// resume on 2 ranks bit-exact. Three short runs.
TEST_F(TrainDist, MixedPrecisionRanksKeepTheMastersOfTheirShard) {
  const std::string run = "--steps 3 --precision bf16 --save-every 2";
  const auto one = train(1, "bf16_one", "", 2, run);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = train(2, "bf16_two", "", 2, run);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  const char* kLast = "checkpoint-000003";
  expect_same_run(path("bf16_one"), path("bf16_two"), kLast, 3);
  // The ranks' own count of the f32 masters they hold: one process all of them; each rank its shard and
  // the f32-read tensors outside it — summed over the ranks, every value once and those once more (here
  // 1.5 × one process's: the untied lm_head, half of this model, is held by one rank only). In f32 (a
  // CPU without AVX512_BF16) every rank holds them all.
  const bool mixed = two.out.find("training in f32") == std::string::npos;
  const ParamCounts c = param_counts(path("bf16_one") / kLast / "model.safetensors");
  const auto j1 = summary(one.out), j2 = summary(two.out);
  EXPECT_EQ(j1["master_weight_bytes"][0].get<int64_t>(), 4 * c.all);
  int64_t held = 0;
  for (int r = 0; r < 2; ++r) {
    const int64_t mine = j2["master_weight_bytes"][r].get<int64_t>() / 4, shard = dist::shard_range(c.all, r, 2).size();
    EXPECT_GE(mine, shard) << "rank " << r;
    EXPECT_LE(mine, mixed ? shard + c.read_in_f32 : c.all) << "rank " << r;
    held += mine;
  }
  EXPECT_EQ(held, mixed ? c.all + c.read_in_f32 : 2 * c.all);
  // Resumed on 2 ranks from step 2's checkpoint (its f32 masters gathered for the save): step 3 bit for bit.
  fs::create_directories(path("bf16_resumed"));
  fs::copy(path("bf16_two") / "checkpoint-000002", path("bf16_resumed") / "checkpoint-000002", fs::copy_options::recursive);
  const auto resumed = train(2, "bf16_resumed", "--resume", 2, run);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : {"model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                        "optimizer-rank00001-of-00002.safetensors"})
    EXPECT_TRUE(read_bytes(path("bf16_two") / kLast / f) == read_bytes(path("bf16_resumed") / kLast / f)) << f;
}

// A tied copy of the fixtures' tiny-vocab in `dir`: tie_word_embeddings set, no lm_head.weight.
void write_tied_checkpoint(const fs::path& dir) {
  const fs::path src = fs::path(testing::fixtures_dir()) / "tiny-vocab";
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "generation_config.json"}) fs::copy_file(src / f, dir / f);
  nlohmann::json config = nlohmann::json::parse(read_bytes(src / "config.json"));
  config["tie_word_embeddings"] = true;
  std::ofstream(dir / "config.json") << config.dump();
  auto file = SafetensorsFile::open((src / "model.safetensors").string());
  ASSERT_TRUE(file.ok());
  std::vector<TensorToWrite> kept;
  for (const auto& [name, t] : file->tensors())
    if (name != "lm_head.weight") kept.push_back({name, t.dtype, t.shape, t.data});
  ASSERT_EQ(kept.size() + 1, file->tensors().size());
  ASSERT_TRUE(write_safetensors((dir / "model.safetensors").string(), kept).ok());
}

// Tied embeddings in sharded bf16 mixed precision: the table's f32 masters stay whole on every rank (the
// lookup reads them) and its bf16 panels, the lm_head's, are re-laid from the all-gathered f32; its
// gradient (the lm_head's dW, then the lookup's scatter) is reduced once per step (2 micro-batches per rank
// and the memory for it: the whole local buffer), after the last backward. 2 ranks of 2 micro-batches each
// equal one process of 4 within 1e-6 (weights and losses); each rank counts the masters of its shard and
// the f32-read tensors outside it, and as gradients its shard of the sums and the whole local buffer.
// Two short runs.
TEST_F(TrainDist, TiedEmbeddingsShardedInMixedPrecision) {
  write_tied_checkpoint(path("tied"));
  const std::string run = "--steps 2 --precision bf16 --save-every 2", model = path("tied").string();
  const auto one = train(1, "tied_one", "", 4, run, model);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = train(2, "tied_two", "", 4, run, model);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  const char* kLast = "checkpoint-000002";
  expect_same_run(path("tied_one"), path("tied_two"), kLast, 2);
  const ParamCounts c = param_counts(path("tied_one") / kLast / "model.safetensors");
  ASSERT_EQ(c.lm_head, 0) << "the checkpoint stayed tied";
  const bool mixed = two.out.find("training in f32") == std::string::npos;
  const auto j1 = summary(one.out), j2 = summary(two.out);
  EXPECT_EQ(j1["master_weight_bytes"][0].get<int64_t>(), 4 * c.all);
  EXPECT_EQ(j1["gradient_bytes"][0].get<int64_t>(), 4 * c.all);
  int64_t held = 0;
  for (int r = 0; r < 2; ++r) {
    const int64_t shard = dist::shard_range(c.all, r, 2).size();
    held += j2["master_weight_bytes"][r].get<int64_t>() / 4;
    EXPECT_EQ(j2["gradient_bytes"][r].get<int64_t>(), 4 * (shard + c.all)) << "rank " << r;
  }
  EXPECT_EQ(held, mixed ? c.all + c.read_in_f32 : 2 * c.all);
}

// A copy of tiny-vocab with 5 layers (layer il a copy of layer il % 2), for the shared slots' reuse.
void write_five_layer_checkpoint(const fs::path& dir) {
  const fs::path src = fs::path(testing::fixtures_dir()) / "tiny-vocab";
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "generation_config.json"}) fs::copy_file(src / f, dir / f);
  nlohmann::json config = nlohmann::json::parse(read_bytes(src / "config.json"));
  ASSERT_EQ(config["num_hidden_layers"], 2);
  config["num_hidden_layers"] = 5;
  std::ofstream(dir / "config.json") << config.dump();
  auto file = SafetensorsFile::open((src / "model.safetensors").string());
  ASSERT_TRUE(file.ok());
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : file->tensors()) {
    if (name.rfind("model.layers.1.", 0) == 0) continue;
    if (name.rfind("model.layers.0.", 0) != 0) {
      out.push_back({name, t.dtype, t.shape, t.data});
      continue;
    }
    for (int il = 0; il < 5; ++il) {
      const std::string from = "model.layers." + std::to_string(il % 2) + "." + name.substr(15);
      const auto it = file->tensors().find(from);
      ASSERT_NE(it, file->tensors().end()) << from;
      out.push_back({"model.layers." + std::to_string(il) + "." + name.substr(15), it->second.dtype, it->second.shape,
                     it->second.data});
    }
  }
  ASSERT_TRUE(write_safetensors((dir / "model.safetensors").string(), out).ok());
}

// Five layers in ZeRO-2's two shared slots (layer il in slot il % 2): each layer's reduce-scatter travels
// while the backward computes the next layer into the other slot, and a slot is reused (layers 2, 1, 0)
// only once its reduction has finished and cleared it. 2 ranks equal one process within 1e-6, with one
// micro-batch per rank and with two reduced each (DIFFUCODER_GRAD_REDUCTION=micro-batch), and each rank
// holds two layers' slots (not five). Four short runs.
TEST_F(TrainDist, LayersShareTwoSlotsWhileTheirReductionsTravel) {
  write_five_layer_checkpoint(path("five"));
  const std::string run = "--steps 3 --precision f32 --save-every 3", model = path("five").string();
  const auto one = train(1, "five_one", "", 2, run, model);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = train(2, "five_two", "", 2, run, model);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  const char* kLast = "checkpoint-000003";
  expect_same_run(path("five_one"), path("five_two"), kLast, 3);
  const ParamCounts c = param_counts(path("five_one") / kLast / "model.safetensors");
  ASSERT_GT(c.lm_head, 0);
  const auto j2 = summary(two.out);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(j2["gradient_bytes"][r].get<int64_t>(),
              4 * (c.all - c.lm_head - c.in_layers / 5 * 3 + dist::shard_range(c.all, r, 2).size())) << "rank " << r;
  const auto one4 = train(1, "five_one4", "", 4, run, model);
  ASSERT_EQ(one4.exit_code, 0) << one4.out;
  const auto two4 = train_under("DIFFUCODER_GRAD_REDUCTION=micro-batch " + launcher(2), "five_two4", "", 4, run, model);
  ASSERT_EQ(two4.exit_code, 0) << two4.out;
  expect_same_run(path("five_one4"), path("five_two4"), kLast, 3);
}

// Several micro-batches per rank (--grad-accum 4 on 2 ranks): reduced once per step from a whole local
// buffer (the default when it fits; the 2 micro-batches summed on the rank first) or every micro-batch
// from the shared slots (DIFFUCODER_GRAD_REDUCTION=micro-batch, ZeRO-2's least memory). The two orders
// of the same additions agree within rounding (1e-6, weights and losses), a rerun once per step is bit for
// bit the same, and each counts its gradient memory: the whole buffer, or the slots (the lm_head's in the
// table's). Three short runs.
TEST_F(TrainDist, GradAccumReducedOncePerStepEqualsPerMicroBatch) {
  const std::string run = "--steps 4 --precision f32 --save-every 4";
  const auto once = train(2, "once", "", 4, run);
  ASSERT_EQ(once.exit_code, 0) << once.out;
  const auto again = train(2, "once_again", "", 4, run);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  const auto each = train_under("DIFFUCODER_GRAD_REDUCTION=micro-batch " + launcher(2), "each", "", 4, run,
                                testing::fixtures_dir() + "/tiny-vocab");
  ASSERT_EQ(each.exit_code, 0) << each.out;
  const char* kLast = "checkpoint-000004";
  expect_same_run(path("each"), path("once"), kLast, 4);
  EXPECT_TRUE(read_bytes(path("once") / kLast / "model.safetensors") ==
              read_bytes(path("once_again") / kLast / "model.safetensors"));
  EXPECT_EQ(losses(path("once") / "metrics.jsonl"), losses(path("once_again") / "metrics.jsonl"));
  const ParamCounts c = param_counts(path("once") / kLast / "model.safetensors");
  ASSERT_GT(c.lm_head, 0);
  const auto j_once = summary(once.out), j_each = summary(each.out);
  for (int r = 0; r < 2; ++r) {
    const int64_t shard = dist::shard_range(c.all, r, 2).size();
    EXPECT_EQ(j_once["gradient_bytes"][r].get<int64_t>(), 4 * (c.all + shard)) << "rank " << r;
    EXPECT_EQ(j_each["gradient_bytes"][r].get<int64_t>(), 4 * (c.all - c.lm_head + shard)) << "rank " << r;
  }
  // the bytes sent: one reduction of the gradients per step instead of two (the weights' all-gather alike)
  EXPECT_LT(j_once["bytes_sent_per_step"][0].get<double>(), 0.8 * j_each["bytes_sent_per_step"][0].get<double>());
}

// Two hosts on this machine (tests/dist/netns_hosts.sh): two network namespaces joined by one veth link,
// 192.0.2.1 and 192.0.2.2, each with a loopback of its own. `mpirun --hostfile` starts the second host's
// daemon through its remote-start agent, as it would over ssh, and every byte between the ranks (and
// between the daemons) crosses that link. Each test makes its own pair and removes it.
class TwoHosts : public TrainDist {
 protected:
  void SetUp() override {
    hosts_ = path("hosts_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    const auto up = testing::run_command(std::string(DC_NETNS_HOSTS) + " up " + hosts_.string());
    if (up.exit_code != 0) GTEST_SKIP() << "two hosts need network namespaces (root, iproute2): " << up.err;
    made_ = true;
    std::istringstream(read_bytes(hosts_ / "names")) >> host_a_ >> host_b_;
  }
  void TearDown() override {
    if (made_) testing::run_command(std::string(DC_NETNS_HOSTS) + " down " + hosts_.string());
  }
  // mpirun started on the first host, one rank per host, TCP only over the link.
  std::string launcher() const {
    return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ip netns exec " + host_a_ + " " DC_MPIEXEC
           " -np 2 --hostfile " + (hosts_ / "hostfile").string() + " --mca plm_rsh_agent " +
           (hosts_ / "agent").string() + " --mca btl self,tcp --mca btl_tcp_if_include 192.0.2.0/24"
           " --mca oob_tcp_if_include 192.0.2.0/24 --display-map" + sanitizer_options(false);
  }
  fs::path hosts_;
  std::string host_a_, host_b_;  // the namespaces' names; host_b_'s end of the link is "v" + host_b_
  bool made_ = false;
};

// The bf16 run (the default precision) on the two hosts equals one process within 1e-6, and the map
// and the agent show rank 1 on the second host, started remotely.
TEST_F(TwoHosts, TrainFromAHostfileEqualsOneProcess) {
  const std::string run = "--steps 3 --precision bf16 --save-every 3";
  const auto one = train(1, "hosts_one", "", 2, run);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = train_under(launcher(), "hosts_two", "", 2, run, testing::fixtures_dir() + "/tiny-vocab");
  ASSERT_EQ(two.exit_code, 0) << two.out;
  // (mpirun names its own host by the machine's name, the other by the hostfile's address)
  const size_t remote = two.out.find("Data for node: 192.0.2.2");
  ASSERT_NE(remote, std::string::npos) << two.out;
  EXPECT_NE(two.out.find("Process rank: 1", remote), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("Process rank: 1"), two.out.find("Process rank: 1", remote)) << two.out;
  EXPECT_EQ(read_bytes(hosts_ / "agent.log"), "192.0.2.2\n") << "the second host's daemon, started by the agent";
  EXPECT_EQ(summary(two.out)["ranks"], 2);
  expect_same_run(path("hosts_one"), path("hosts_two"), "checkpoint-000003", 3);
}

// The link between the hosts goes down in the middle of a run (no rank dies, no connection is reset: the
// packets just stop, as when a switch or cable fails). Each rank's watchdog ends it after --dist-timeout
// with a message that says what to do; once the link is back the launcher ends the job with a non-zero
// exit, and every checkpoint left is a complete one.
TEST_F(TwoHosts, LinkLostMidRunEndsTheJobWithAMessage) {
  const fs::path out = path("hosts_cut"), log = path("hosts_cut.log");
  const std::string train_cmd = launcher() + DC_BINARY_PATH + " train --model " + testing::fixtures_dir() +
                                "/tiny-vocab --data " + (dir_ / "sft.jsonl").string() +
                                " --steps 100000 --precision f32 --save-every 2 --seq-len 32 --batch-size 1"
                                " --grad-accum 2 --threads 1 --instruct-template --quiet --dist-timeout 3 --out " +
                                out.string();
  // (polls bounded: 60 s for two steps, 30 s for the message, 60 s for the job's end once the link is back;
  // $! is mpirun's pid: `ip netns exec` execs it)
  const std::string script =
      train_cmd + " > " + log.string() + " 2>&1 & pid=$!\n"
      "i=0; while [ \"$(cat " + (out / "metrics.jsonl").string() + " 2>/dev/null | wc -l)\" -lt 2 ] && [ $i -lt 300 ];"
      " do sleep 0.2; i=$((i+1)); done\n"
      "ip -n " + host_b_ + " link set v" + host_b_ + " down\n"
      "i=0; while ! grep -q \"no answer from the other ranks\" " + log.string() + " && [ $i -lt 150 ];"
      " do sleep 0.2; i=$((i+1)); done\n"
      "ip -n " + host_b_ + " link set v" + host_b_ + " up\n"
      "i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done\n"
      "if kill -0 $pid 2>/dev/null; then kill -9 $pid; echo still running; exit 99; fi\n"
      "wait $pid; echo exit=$?\n";
  std::ofstream(path("hosts_cut.sh")) << script;
  const auto r = testing::run_command("sh " + path("hosts_cut.sh").string());
  const std::string printed = read_bytes(log);
  EXPECT_EQ(r.out.find("still running"), std::string::npos) << printed;
  EXPECT_EQ(r.out.find("exit=0"), std::string::npos) << r.out << printed;
  EXPECT_NE(r.out.find("exit="), std::string::npos) << r.out << r.err;
  EXPECT_NE(printed.find("no answer from the other ranks for 3 s"), std::string::npos) << printed;
  EXPECT_NE(printed.find("continue from the last checkpoint with --resume"), std::string::npos) << printed;
  int complete = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    if (!fs::is_directory(e.path())) continue;
    for (const char* f : {"model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                          "optimizer-rank00001-of-00002.safetensors"})
      EXPECT_TRUE(fs::exists(e.path() / f)) << e.path() << " lacks " << f;
    ++complete;
  }
  EXPECT_GE(complete, 1) << "the run saved every 2 steps and got past step 2";
}

TEST_F(TrainDist, GradAccumMustSplitOverTheRanks) {
  const auto r = train(2, "bad", "", 3);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--grad-accum 3 is not a multiple of the 2 ranks"), std::string::npos) << r.out;
}

// Coupled-GRPO with fixed rollouts (tests/dist/grpo_dist_check.cc: the same completions whichever rank
// draws them): 2 ranks, each generating one of the round's 2 groups and running one of its 2 micro-batches,
// end with the weights and the reference model of one process within 1e-6; a run stopped after its first
// round and resumed from that checkpoint is bit-identical (its first round a rerun's, its second a resume's).
TEST_F(TrainDist, GrpoOnTwoRanksEqualsOneProcess) {
  const auto grpo = [](int ranks, const std::string& out, const std::string& extra = "") {
    testing::RunResult r = testing::run_command(launcher(ranks) + DC_GRPO_DIST_CHECK + " " + testing::fixtures_dir() +
                                                "/tiny-vocab " + path(out).string() + " " + extra);
    r.out += r.err;
    return r;
  };
  const char* kLast = "checkpoint-000004";
  const auto one = grpo(1, "g1");
  ASSERT_EQ(one.exit_code, 0) << one.out;
  const auto two = grpo(2, "g2");
  ASSERT_EQ(two.exit_code, 0) << two.out;
  EXPECT_NE(two.out.find("step 4 loss"), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("step 4 loss"), two.out.rfind("step 4 loss")) << "rank 0 only prints: " << two.out;
  for (const char* f : {"model.safetensors", "ref_model.safetensors"})
    expect_within(path("g1") / kLast / f, path("g2") / kLast / f, 1e-6);
  EXPECT_NE(read_bytes(path("g2") / kLast / "ref_model.safetensors"),
            read_bytes(fs::path(testing::fixtures_dir()) / "tiny-vocab" / "model.safetensors")) << "no reference sync";
  // The loss curve: one process's within 1e-5 relative. Not 1e-6: the loss is Σ −A·ratio (+ β·KL) with
  // advantages that sum to zero in each group, so it cancels to a value far below its terms, and their
  // rounding shows ~10x larger in it (the weights above are within 1e-6).
  const auto l1 = losses(path("g1/metrics.jsonl")), l2 = losses(path("g2/metrics.jsonl"));
  ASSERT_EQ(l1.size(), 4u);
  ASSERT_EQ(l2.size(), 4u);
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l2[i], 1e-5 * std::fabs(l1[i]) + 1e-12) << "step " << i + 1;
  const char* kFiles[] = {"model.safetensors", "ref_model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                          "optimizer-rank00001-of-00002.safetensors"};
  const auto stopped = grpo(2, "g2_resumed", "--stop-after 2");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.out;
  ASSERT_TRUE(fs::exists(path("g2_resumed") / "checkpoint-000002"));
  const auto resumed = grpo(2, "g2_resumed", "--resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  for (const char* f : kFiles)
    EXPECT_TRUE(read_bytes(path("g2") / kLast / f) == read_bytes(path("g2_resumed") / kLast / f)) << f;
}

// `mpirun -np 2 diffucoder grpo` end to end on the tiny real-vocabulary checkpoint with its own rollouts and
// a user reward: one progress line per step (rank 0's), a checkpoint with the reference model and a
// moment shard per rank, half the optimizer state on each.
TEST_F(TrainDist, GrpoCliOnTwoRanks) {
  std::ofstream(dir_ / "grpo.jsonl") << R"({"prompt": "Write f(x) returning x+1.", "tests": ["assert f(1) == 2"]})" "\n"
                                     << R"({"prompt": "Write g(x) returning 2*x.", "tests": ["assert g(2) == 4"]})" "\n";
  std::ofstream(dir_ / "reward.py") << "import json, sys\n"
                                       "for line in sys.stdin:\n"
                                       "    print(json.loads(line)['completion'].count('e'))\n";
  const auto r = testing::run_command(
      launcher(2) + DC_BINARY_PATH + " grpo --model " + testing::fixtures_dir() + "/tiny-vocab --data " +
      (dir_ / "grpo.jsonl").string() + " --num-generations 4 --prompts-per-round 2 --max-completion-length 8 "
      "--diffusion-steps 8 --steps 2 --lr 1e-2 --threads 1 --code-weight 0 --format-weight 0 --reward-program "
      "/usr/bin/python3 " + (dir_ / "reward.py").string() + " --out " + path("gcli").string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("2 ranks, ZeRO-sharded optimizer state (mpi)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step     2/2"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("step     2/2"), r.err.rfind("step     2/2")) << "progress from rank 0 only: " << r.err;
  const size_t at = r.out.rfind("{\"steps\"");
  ASSERT_NE(at, std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(at, r.out.find('\n', at) - at));
  EXPECT_EQ(j["ranks"], 2);
  const int64_t s0 = j["optimizer_state_bytes"][0], s1 = j["optimizer_state_bytes"][1];
  EXPECT_LE(std::abs(s0 - s1), 8) << s0 << " " << s1;
  for (const char* f : {"model.safetensors", "ref_model.safetensors", "optimizer-rank00000-of-00002.safetensors",
                        "optimizer-rank00001-of-00002.safetensors"})
    EXPECT_TRUE(fs::exists(path("gcli") / "checkpoint-000002" / f)) << f;
}

TEST_F(TrainDist, GrpoGroupsMustSplitOverTheRanks) {
  const std::string bad = (dir_ / "bad.jsonl").string();
  std::ofstream(bad) << R"({"prompt": "Write f(x).", "tests": ["assert f(1) == 2"]})" "\n";
  const auto r = testing::run_command(launcher(2) + DC_BINARY_PATH + " grpo --model " + testing::fixtures_dir() +
                                      "/tiny-vocab --data " + bad + " --out " + path("gbad").string() +
                                      " --prompts-per-round 1 --steps 2 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("--prompts-per-round 1 and --grad-accum 2 must be multiples of the 2 ranks"),
            std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace dc