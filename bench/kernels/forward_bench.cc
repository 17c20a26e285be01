// forward_bench: one full-recompute Model::forward of a random bf16 Dream model at the Qwen2.5-0.5B or
// DiffuCoder-7B shape, timed with the reference kernels, the fast kernels (f32 activations) and the fast
// kernels with bf16 activations; prints ms per pass, GFLOP/s, the fraction of the measured bf16 GEMM
// peak and (--breakdown) where the time goes, from the gaps between the forward's observer callbacks.
// Usage: forward_bench [--model 0.5b|7b] [--seq L] [--out N] [--threads N] [--reps R] [--modes ref,f32,bf16]
//                      [--breakdown]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "model/weights.h"
#include "ops/peak.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the whole process (all threads), ms: on a shared machine, wall time minus descheduling.
double process_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

dc::ModelConfig shape_config(const std::string& model) {
  dc::ModelConfig c;
  if (model == "7b") {
    c.n_vocab = 152064, c.n_embd = 3584, c.n_ff = 18944, c.n_layer = 28, c.n_head = 28, c.n_head_kv = 4;
    c.head_dim = 128;
  } else {
    c.n_vocab = 151936, c.n_embd = 896, c.n_ff = 4864, c.n_layer = 24, c.n_head = 14, c.n_head_kv = 2;
    c.head_dim = 64;
  }
  c.rope_theta = 1e6;
  return c;
}

// A random bf16 model (matrices uniform in ±0.035, std ~0.02; norms 1; biases ±0.01), filled on `pool`.
std::unique_ptr<dc::Model> random_model(const dc::ModelConfig& c, dc::ThreadPool* pool) {
  dc::ModelWeights w;
  auto vectors = std::make_shared<dc::VectorStore>(c);
  int64_t total = 0;
  std::vector<std::pair<dc::WeightView*, int64_t>> mats;
  dc::visit_weights(c, w, [&](const dc::WeightSlot& slot) {
    if (slot.matrix) {
      mats.emplace_back(slot.matrix, total);
      *slot.matrix = dc::WeightView{dc::DType::kBF16, nullptr, slot.shape[0], slot.shape[1]};
      total += slot.shape[0] * slot.shape[1];
    } else {
      const std::span<float> v = vectors->take(slot.shape[0]);
      std::fill(v.begin(), v.end(), 1.0f);
      if (slot.name.find("bias") != std::string::npos)
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * ((i * 7919 % 201) / 100.0f - 1);
      *slot.vector = v;
    }
  });
  auto storage = std::shared_ptr<uint16_t[]>(new uint16_t[total]);
  uint16_t* data = storage.get();
  pool->parallel_for(total / 4096 + 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b * 4096; i < std::min(total, e * 4096); ++i) {
      uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      const float u = static_cast<float>((z >> 40) & 0xffffff) / 16777216.0f;  // [0, 1)
      data[i] = dc::f32_to_bf16((u * 2 - 1) * 0.035f);
    }
  });
  for (auto& [view, offset] : mats) view->data = data + offset;
  if (c.tie_word_embeddings) w.output = w.tok_embd;
  auto both = std::make_shared<std::pair<std::shared_ptr<uint16_t[]>, std::shared_ptr<dc::VectorStore>>>(storage, vectors);
  return dc::Model::from_weights(c, std::move(w), std::static_pointer_cast<const void>(both));
}

double forward_flops(const dc::ModelConfig& c, int64_t T, int64_t L, int64_t n_out) {
  const double q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim, E = c.n_embd, F = c.n_ff;
  const double per_token = 2.0 * (E * q + 2 * E * kv + q * E + 3 * E * F);
  return c.n_layer * (T * per_token + 4.0 * T * L * q) + 2.0 * n_out * E * c.n_vocab;
}

// Stage names of the observer ("L3.attn_norm" → "attn_norm"); the time since the previous callback is
// charged to the stage that just finished.
std::string stage_of(const std::string& name) {
  const size_t dot = name.find('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

const char* kStageHelp[][2] = {
    {"attn_norm", "RMSNorm (+ the previous layer's tail)"}, {"q", "q/k/v matmuls + biases + RoPE"},
    {"k", "(observer only)"}, {"v", "(observer only)"}, {"attn", "attention"},
    {"attn_residual", "o matmul + residual add"}, {"ffn_norm", "RMSNorm"},
    {"out", "gate/up matmuls, SwiGLU, down matmul, residual add"}, {"output_norm", "final RMSNorm"},
};

}  // namespace

int main(int argc, char** argv) {
  std::string model = "0.5b", modes = "ref,f32,bf16";
  int64_t L = 320, n_out = -1;
  int threads = 0, reps = 5;
  bool breakdown = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--seq" && i + 1 < argc) L = std::atoll(argv[++i]);
    else if (a == "--out" && i + 1 < argc) n_out = std::atoll(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--modes" && i + 1 < argc) modes = argv[++i];
    else if (a == "--breakdown") breakdown = true;
    else {
      std::fprintf(stderr, "usage: forward_bench [--model 0.5b|7b] [--seq L] [--out N] [--threads N] [--reps R] "
                           "[--modes ref,f32,bf16] [--breakdown]\n");
      return 2;
    }
  }
  if (n_out < 0) n_out = L;
  dc::ThreadPool pool(threads);
  const dc::ModelConfig config = shape_config(model);
  auto t0 = Clock::now();
  auto m = random_model(config, &pool);
  std::printf("model %s: %ld layers, built in %.1f s; L = %ld, logits rows = %ld, threads %d\n", model.c_str(),
              static_cast<long>(config.n_layer), std::chrono::duration<double>(Clock::now() - t0).count(),
              static_cast<long>(L), static_cast<long>(n_out), pool.n_threads());
  const double peak = dc::measure_bf16_gemm_peak_gflops(&pool);
  std::printf("measured bf16 GEMM peak: %.1f GFLOP/s\n", peak);

  std::vector<int32_t> tokens(L);
  for (int64_t i = 0; i < L; ++i) tokens[i] = static_cast<int32_t>((i * 7919) % config.n_vocab);
  std::vector<int64_t> rows(n_out);
  for (int64_t r = 0; r < n_out; ++r) rows[r] = L - n_out + r;
  dc::ForwardBatch batch;
  batch.n_batch = 1;
  batch.n_seq = L;
  batch.tokens = tokens.data();
  batch.out_rows = rows.data();
  batch.n_out = n_out;
  std::vector<float> logits(std::max<int64_t>(1, n_out) * config.n_vocab);
  const double flops = forward_flops(config, L, L, n_out);
  std::printf("%.1f GFLOP per forward\n", flops * 1e-9);

  for (size_t pos = 0; pos < modes.size();) {
    size_t comma = modes.find(',', pos);
    if (comma == std::string::npos) comma = modes.size();
    const std::string mode = modes.substr(pos, comma - pos);
    pos = comma + 1;
    dc::Context ctx{dc::Device::kCpu, &pool};
    dc::Workspace workspace;  // the activations reused across repetitions, as in a generation
    ctx.workspace = &workspace;
    ctx.reference_kernels = mode == "ref";
    if (mode == "bf16") ctx.matmul_precision = dc::MatmulPrecision::kBF16;
    std::map<std::string, double> stage_ms;
    Clock::time_point last;
    dc::ForwardObserver obs = [&](const std::string& name, const float*, const std::vector<int64_t>&) {
      const auto now = Clock::now();
      stage_ms[stage_of(name)] += std::chrono::duration<double, std::milli>(now - last).count();
      last = now;
    };
    std::vector<double> ms, cpu_ms;
    const int n_reps = mode == "ref" ? std::min(reps, 2) : reps;
    for (int r = 0; r < n_reps; ++r) {
      stage_ms.clear();
      last = Clock::now();
      const double cpu0 = process_cpu_ms();
      const auto t = Clock::now();
      const dc::Status s = m->forward(ctx, batch, logits.data(), breakdown ? &obs : nullptr);
      const auto end = Clock::now();
      if (!s.ok()) {
        std::fprintf(stderr, "forward failed: %s\n", s.to_string().c_str());
        return 1;
      }
      if (breakdown) stage_ms["lm_head"] += std::chrono::duration<double, std::milli>(end - last).count();
      ms.push_back(std::chrono::duration<double, std::milli>(end - t).count());
      cpu_ms.push_back((process_cpu_ms() - cpu0) / pool.n_threads());
    }
    std::sort(ms.begin(), ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    const double best = ms.front(), median = ms[ms.size() / 2];
    std::printf("%-5s best %8.1f ms  median %8.1f ms  %7.1f GFLOP/s (best)  %5.1f%% of peak   [CPU time / threads: "
                "best %.1f ms]\n", mode.c_str(), best, median, flops / (best * 1e6), 100 * flops / (best * 1e6) / peak,
                cpu_ms.front());
    if (breakdown) {
      for (const auto& help : kStageHelp) {
        auto it = stage_ms.find(help[0]);
        if (it != stage_ms.end() && it->second > 0.05)
          std::printf("        %-14s %8.1f ms  %s\n", help[0], it->second, help[1]);
      }
      std::printf("        %-14s %8.1f ms  %s\n", "lm_head", stage_ms["lm_head"], "final rows' lm_head (last run)");
    }
    std::fflush(stdout);
  }
  return 0;
}
