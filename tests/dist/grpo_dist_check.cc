// Coupled-GRPO over ranks with fixed rollouts, for the TrainDist tests (run alone and under
// `mpirun -np N`): `grpo_dist_check MODEL_DIR OUT_DIR [--stop-after S] [--resume]` trains the tiny policy
// of MODEL_DIR for 4 steps (2 rounds of 2 prompts × 4 completions in 4 micro-batches, 2 iterations, the reference model mixed
// in every 2 steps) and writes its checkpoints to OUT_DIR. The completions and rewards are a pure function
// of (round, prompt, completion index), not of the policy or of which rank draws them, so a run on N ranks
// sees exactly the completions of one process and must end with the same weights within float rounding.
// --stop-after S: stop after step S (a round boundary), writing its checkpoint, as a stopped job would.
// --device SPEC: the loss, backward and step on a Vulkan device (SPEC as train's: vulkan:0 every rank on
// device 0), one per rank (api's open_rank_device's rule, here through ops' parse_rank_device).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/splitmix64.h"
#include "core/thread_pool.h"
#include "dist/comm.h"
#include "ops/device.h"
#include "train/grpo_trainer.h"

namespace {

using namespace dc;
using namespace dc::train;

constexpr int64_t kCompletion = 6;  // tokens per completion

Result<Rollout> fixed_rollout(const Context&, const Model& policy, int64_t round, const std::vector<int64_t>& prompts) {
  const int64_t G = 4, vocab = policy.config().n_vocab;
  Rollout r;
  r.batch.n_batch = static_cast<int64_t>(prompts.size()) * G, r.batch.n_prompt = 3, r.batch.n_completion = kCompletion;
  double low = 0;
  for (int64_t p : prompts)
    for (int64_t g = 0; g < G; ++g) {
      for (int32_t id : {static_cast<int32_t>(1 + p % 5), 2, 3}) r.batch.prompt_ids.push_back(id);
      double n_low = 0;
      for (int64_t j = 0; j < kCompletion; ++j) {
        const uint64_t h = splitmix64((static_cast<uint64_t>(round) << 40) ^ (static_cast<uint64_t>(p) << 20) ^
                                      static_cast<uint64_t>(g * kCompletion + j));
        const int32_t id = static_cast<int32_t>(4 + h % static_cast<uint64_t>(std::min<int64_t>(vocab - 4, 40)));
        r.batch.completion_ids.push_back(id);
        r.batch.completion_mask.push_back(j < kCompletion - static_cast<int64_t>(h >> 62) ? 1 : 0);
        n_low += id < 24;
      }
      r.rewards.push_back(n_low / kCompletion);
      low += n_low / kCompletion;
    }
  r.metrics = {{"low_token_rate", low / static_cast<double>(r.batch.n_batch)}};
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: grpo_dist_check MODEL_DIR OUT_DIR [--stop-after S] [--resume]\n");
    return 2;
  }
  GrpoOptions o;
  o.model_dir = argv[1], o.out_dir = argv[2];
  int64_t stop_after = 0;
  std::string device = "cpu";
  for (int i = 3; i < argc; ++i) {
    if (std::strcmp(argv[i], "--resume") == 0) o.resume = true;
    if (std::strcmp(argv[i], "--stop-after") == 0 && i + 1 < argc) stop_after = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
  }
  o.n_prompts = 6, o.steps = 4, o.group_size = 4, o.prompts_per_round = 2, o.grad_accum = 4, o.num_iterations = 2;
  o.ref_sync_steps = 2, o.seed = 7;
  o.lr.lr = 2e-3, o.lr.schedule = LrSchedule::kConstant, o.warmup_ratio = 0;
  o.max_grad_norm = 1.0, o.precision = MatmulPrecision::kF32;
  auto comm = dist::world_comm(120);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    return 1;
  }
  if ((*comm)->size() > 1) o.comm = comm->get();
  ThreadPool pool(1);
  Context ctx;
  ctx.pool = &pool;
  std::unique_ptr<DeviceBackend> backend;
  const Result<DeviceSpec> spec = parse_rank_device(device, (*comm)->local_rank());
  Status st = spec.status();
  if (st.ok() && spec->device != Device::kCpu) {
    auto opened = open_vulkan_backend(spec->index);
    st = opened.status();
    if (st.ok()) backend = std::move(*opened), ctx.device = spec->device, ctx.backend = backend.get();
  }
  auto trainer = st.ok() ? GrpoTrainer::create(o, ctx, fixed_rollout) : Result<std::unique_ptr<GrpoTrainer>>(st);
  st = trainer.status();
  const int64_t last = stop_after > 0 ? std::min(stop_after, o.steps) : o.steps;
  while (st.ok() && (*trainer)->steps_done() < last) {
    auto s = (*trainer)->step();
    st = s.status();
    if (st.ok() && (*comm)->rank() == 0)
      std::printf("step %lld loss %.9g reward %.6f\n", (long long)s->step, s->loss, s->reward_mean);
  }
  if (st.ok()) st = (*trainer)->save();
  if (!st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", (*comm)->rank(), st.message().c_str());
    return 1;
  }
  return 0;
}
