// quantized_model_bench: the logit error of q8 / q4 weights (quantize_weights, each variant: group size,
// symmetric or with mins, embeddings quantized or kept) against the unquantized bf16 model, on a random
// model of the Qwen2.5-0.5B shape (151936 x 896, 14 heads, 2 KV heads) over 64 random tokens: relative
// logit error, top-1 agreement, forward time (best of three) and quantization time per variant.
// Environment (as the GoogleTest benchmark it replaces): DC_LAYERS layers (default 4); DC_REF=1 adds each
// variant's error with f32 activations through the reference kernels (slow).
// Usage: build/bench/quantized_model_bench (docs/bench.md; BENCHMARKS.md "Quantized weights").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "model/quantize.h"
#include "model/transformer.h"
#include "model/weights.h"

namespace {

using namespace dc;

// One sequence of `tokens` with every row's logits asked for.
struct Tokens {
  std::vector<int32_t> ids;
  std::vector<int64_t> rows;
  ForwardBatch batch() const {
    ForwardBatch b;
    b.n_batch = 1;
    b.n_seq = static_cast<int64_t>(ids.size());
    b.tokens = ids.data();
    b.out_rows = rows.data();
    b.n_out = static_cast<int64_t>(rows.size());
    return b;
  }
};

// logits [rows, n_vocab]; exits on a failed forward (a broken benchmark, not a number).
std::vector<float> logits_of(const Model& model, const Tokens& t, const Context& ctx) {
  std::vector<float> out(t.rows.size() * model.config().n_vocab);
  if (const Status s = model.forward(ctx, t.batch(), out.data()); !s.ok()) {
    std::fprintf(stderr, "quantized_model_bench: forward failed: %s\n", s.to_string().c_str());
    std::exit(1);
  }
  return out;
}

// ‖got − want‖ / ‖want‖ over all logits.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double d2 = 0, w2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w2 += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(d2 / w2);
}

ModelConfig qwen05b_shape(int64_t layers) {
  ModelConfig c;
  c.n_vocab = 151936;
  c.n_embd = 896;
  c.n_ff = 4864;
  c.n_layer = layers;
  c.n_head = 14;
  c.n_head_kv = 2;
  c.head_dim = 64;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = false;
  return c;
}

// Random bf16 matrices from N(0, 0.02²), norm weights 1, biases from N(0, 0.02²); the model owns them.
std::unique_ptr<Model> random_bf16_model(const ModelConfig& c, std::mt19937& gen, ModelWeights& dense) {
  struct Store {
    explicit Store(const ModelConfig& c) : vectors(c) {}
    VectorStore vectors;
    std::vector<std::vector<uint16_t>> matrices;
  };
  auto store = std::make_shared<Store>(c);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  visit_weights(c, dense, [&](const WeightSlot& slot) {
    if (slot.matrix != nullptr) {
      store->matrices.emplace_back(slot.shape[0] * slot.shape[1]);
      for (auto& v : store->matrices.back()) v = f32_to_bf16(normal(gen));
      *slot.matrix = WeightView{DType::kBF16, store->matrices.back().data(), slot.shape[0], slot.shape[1]};
    } else {
      const std::span<float> vec = store->vectors.take(slot.shape[0]);
      const bool norm = slot.name.find("norm") != std::string::npos;
      for (auto& v : vec) v = norm ? 1.0f : normal(gen);
      *slot.vector = vec;
    }
  });
  return Model::from_weights(c, dense, store);
}

}  // namespace

int main() {
  const int64_t layers = std::getenv("DC_LAYERS") ? std::atoi(std::getenv("DC_LAYERS")) : 4;
  if (layers < 1 || layers > 1024) {
    std::fprintf(stderr, "quantized_model_bench: DC_LAYERS must be in [1, 1024], got %lld\n", (long long)layers);
    return 2;
  }
  const ModelConfig c = qwen05b_shape(layers);
  std::mt19937 gen(42);
  ModelWeights dense;
  auto base = random_bf16_model(c, gen, dense);
  ThreadPool pool(0);
  Tokens t;
  std::uniform_int_distribution<int32_t> ids(0, 151642);
  for (int64_t i = 0; i < 64; ++i) {
    t.ids.push_back(ids(gen));
    t.rows.push_back(i);
  }
  const int64_t L = static_cast<int64_t>(t.ids.size());
  const Context fast{Device::kCpu, &pool};
  Context ref = fast;
  ref.reference_kernels = true;
  auto timed_ms = [&](const Model& model) {  // the best of three forwards
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      logits_of(model, t, fast);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const auto want = logits_of(*base, t, fast);
  std::printf("  %-24s forward %.1f ms\n", "bf16 (unquantized)", timed_ms(*base));
  auto top1 = [&](const std::vector<float>& l, int64_t r) {
    return std::max_element(l.begin() + r * c.n_vocab, l.begin() + (r + 1) * c.n_vocab) - (l.begin() + r * c.n_vocab);
  };
  struct Variant {
    const char* name;
    QuantizeOptions o;
  };
  const Variant variants[] = {
      {"q8", {WeightQuant::kQ8, 32, true}},
      {"q8 (embeddings kept)", {WeightQuant::kQ8, 32, false}},
      {"q4 g32 min", {WeightQuant::kQ4, 32, true}},
      {"q4 g32 min (emb. kept)", {WeightQuant::kQ4, 32, false}},
      {"q4 g32 symmetric", {WeightQuant::kQ4, 32, true, Q4Variant::kSymmetric}},
      {"q4 g64 min", {WeightQuant::kQ4, 64, true}},
      {"q4 g128 min", {WeightQuant::kQ4, 128, true}},
      {"q4 g128 min (emb. kept)", {WeightQuant::kQ4, 128, false}},
  };
  std::printf("random Qwen2.5-0.5B shape, %lld layers, %lld tokens\n", (long long)c.n_layer, (long long)L);
  for (const Variant& v : variants) {
    const auto t0 = std::chrono::steady_clock::now();
    auto q = quantize_weights(c, dense, v.o, &pool);
    if (!q.ok()) {
      std::fprintf(stderr, "quantized_model_bench: %s: %s\n", v.name, q.status().to_string().c_str());
      return 1;
    }
    const double quant_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto model = Model::from_weights(c, q->weights, q->storage);
    const auto got = logits_of(*model, t, fast);
    int agree = 0;
    for (int64_t r = 0; r < L; ++r) agree += top1(got, r) == top1(want, r);
    double exact_x = -1;
    if (std::getenv("DC_REF") != nullptr) exact_x = relative_error(logits_of(*model, t, ref), want);
    std::printf("  %-24s rel. logit error %.2e (f32 activations: %.2e)  top-1 agreement %d/%lld  forward %.1f ms"
                "  (quantized in %.1f s)\n",
                v.name, relative_error(got, want), exact_x, agree, (long long)L, timed_ms(*model), quant_s);
  }
  return 0;
}
