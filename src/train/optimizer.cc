// AdamW, gradient clipping and learning-rate schedules.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace dc::train {

namespace {

// Work items of the element-wise passes over every tensor: (tensor, first value) of chunks of 64 Ki values.
constexpr int64_t kChunk = 1 << 16;
std::vector<std::pair<size_t, int64_t>> chunks(const ModelParams& p) {
  std::vector<std::pair<size_t, int64_t>> items;
  for (size_t i = 0; i < p.tensors().size(); ++i)
    for (int64_t b = 0; b < p.tensors()[i].size; b += kChunk) items.emplace_back(i, b);
  return items;
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr, double beta1,
                  double beta2, double eps, double weight_decay) {
  // f32 arithmetic in PyTorch's order; the scalar factors in double as Python computes them.
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2);
  const float one_b1 = static_cast<float>(1.0 - beta1), one_b2 = static_cast<float>(1.0 - beta2);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float e = static_cast<float>(eps);
  for (int64_t i = 0; i < n; ++i) {
    if (weight_decay != 0) p[i] *= decay;
    m[i] = m[i] * b1 + g[i] * one_b1;
    v[i] = v[i] * b2 + one_b2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bc2_sqrt + e;
    p[i] += -step_size * (m[i] / denom);
  }
}

void adamw_step(ModelParams& params, const ModelParams& grads, ModelParams& m, ModelParams& v, int64_t t, double lr,
                const AdamWOptions& o, ThreadPool* pool) {
  const auto& ps = params.tensors();
  const auto items = chunks(params);
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const auto [i, begin] = items[it];
      const int64_t n = std::min(kChunk, ps[i].size - begin);
      const double wd = ps[i].is_matrix || o.decay_vectors ? o.weight_decay : 0.0;
      adamw_update(ps[i].data + begin, grads.tensors()[i].data + begin, m.tensors()[i].data + begin,
                   v.tensors()[i].data + begin, n, t, lr, o.beta1, o.beta2, o.eps, wd);
    }
  }, 1);
}


double global_grad_norm(const ModelParams& grads, ThreadPool* pool) {
  // Per chunk: 8 double lanes (vectorisable); then the chunks in order, so the result does not depend
  // on the thread count.
  const auto items = chunks(grads);
  std::vector<double> partial(items.size());
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const auto [i, begin] = items[it];
      const float* x = grads.tensors()[i].data + begin;
      const int64_t n = std::min(kChunk, grads.tensors()[i].size - begin);
      double lane[8] = {};
      int64_t j = 0;
      for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[j + l]) * x[j + l];
      for (; j < n; ++j) lane[0] += static_cast<double>(x[j]) * x[j];
      partial[it] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
  }, 1);
  double s = 0;
  for (double v : partial) s += v;
  return std::sqrt(s);
}

double clip_grad_norm(ModelParams& grads, double max_norm, ThreadPool* pool) {
  const double norm = global_grad_norm(grads, pool);
  if (max_norm <= 0) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return norm;
  const float c = static_cast<float>(coef);
  const auto items = chunks(grads);
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const auto [i, begin] = items[it];
      float* x = grads.tensors()[i].data + begin;
      const int64_t n = std::min(kChunk, grads.tensors()[i].size - begin);
      for (int64_t j = 0; j < n; ++j) x[j] *= c;
    }
  }, 1);
  return norm;
}

Result<LrSchedule> parse_lr_schedule(const std::string& name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "linear") return LrSchedule::kLinear;
  if (name == "cosine") return LrSchedule::kCosine;
  return invalid_argument("--lr-schedule '" + name + "': expected constant, linear or cosine");
}

double learning_rate(const LrOptions& o, int64_t step) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, o.warmup_steps));
  if (o.schedule == LrSchedule::kConstant) return o.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - o.warmup_steps) / span, 0.0, 1.0);
  const double floor = o.lr * o.min_lr_ratio;
  if (o.schedule == LrSchedule::kLinear) return floor + (o.lr - floor) * (1.0 - progress);
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace dc::train
