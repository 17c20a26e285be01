// AdamW, gradient clipping and learning-rate schedules.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/profiler.h"
#include "ops/adamw.h"

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

// adamw_value over the chunks `items` of every tensor, threaded; gradients scaled by grad_scale.
void adamw_chunks(ModelParams& params, const ModelParams& grads, ModelParams& m, ModelParams& v,
                  const std::vector<std::pair<size_t, int64_t>>& items, int64_t t, double lr, const AdamWOptions& o,
                  float grad_scale, ThreadPool* pool) {
  const auto& ps = params.tensors();
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const auto [i, begin] = items[it];
      const int64_t n = std::min(kChunk, ps[i].size - begin);
      const double wd = ps[i].is_matrix || o.decay_vectors ? o.weight_decay : 0.0;
      const AdamWStep s = adamw_scalars(t, lr, o.beta1, o.beta2, o.eps, wd, grad_scale);
      float* p = ps[i].data + begin;
      const float* g = grads.tensors()[i].data + begin;
      float* mm = m.tensors()[i].data + begin;
      float* vv = v.tensors()[i].data + begin;
      for (int64_t j = 0; j < n; ++j) adamw_value(s, p[j], g[j], mm[j], vv[j]);
    }
  }, 1);
}

// Σ x² of one chunk: 8 double lanes (vectorisable), combined in a fixed order.
double chunk_sum_of_squares(const float* x, int64_t n) {
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[j + l]) * x[j + l];
  for (; j < n; ++j) lane[0] += static_cast<double>(x[j]) * x[j];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, int64_t t, double lr, double beta1,
                  double beta2, double eps, double weight_decay) {
  const AdamWStep s = adamw_scalars(t, lr, beta1, beta2, eps, weight_decay);
  for (int64_t i = 0; i < n; ++i) adamw_value(s, p[i], g[i], m[i], v[i]);
}

void adamw_step(ModelParams& params, const ModelParams& grads, ModelParams& m, ModelParams& v, int64_t t, double lr,
                const AdamWOptions& o, ThreadPool* pool) {
  adamw_chunks(params, grads, m, v, chunks(params), t, lr, o, 1.0f, pool);
}

void adamw_step_mixed(const Context& ctx, ModelParams& params, const ModelParams& grads, ModelParams& m, ModelParams& v,
                      int64_t t, double lr, const AdamWOptions& o, float grad_scale, MixedPrecisionWeights& mixed) {
  const auto& ps = params.tensors();
  std::vector<uint32_t*> panels(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) panels[i] = mixed.panels_of(ps[i].data);
  std::vector<std::pair<size_t, int64_t>> rest;  // the chunks of the tensors without bf16 copies
  for (const auto& item : chunks(params))
    if (panels[item.first] == nullptr) rest.push_back(item);
  {
    const ProfileScope profile(ctx, "AdamW of the tensors without bf16 copies");
    adamw_chunks(params, grads, m, v, rest, t, lr, o, grad_scale, ctx.pool);
  }
  const AdamWStep s = adamw_scalars(t, lr, o.beta1, o.beta2, o.eps, o.weight_decay, grad_scale);  // matrices
  for (size_t i = 0; i < ps.size(); ++i)
    if (panels[i] != nullptr)
      adamw_update_panels(ctx, s, ps[i].data, grads.tensors()[i].data, m.tensors()[i].data, v.tensors()[i].data,
                          ps[i].shape[0], ps[i].shape[1], panels[i]);
  mixed.mark_written();
}

double global_grad_norm(const ModelParams& grads, ThreadPool* pool) {
  const auto items = chunks(grads);
  std::vector<double> partial(items.size());
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const auto [i, begin] = items[it];
      partial[it] = chunk_sum_of_squares(grads.tensors()[i].data + begin, std::min(kChunk, grads.tensors()[i].size - begin));
    }
  }, 1);
  double s = 0;
  for (double v : partial) s += v;
  return std::sqrt(s);
}

double sum_of_squares(const float* x, int64_t n, ThreadPool* pool) {
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(n_chunks));
  parallel_for(pool, n_chunks, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) partial[c] = chunk_sum_of_squares(x + c * kChunk, std::min(kChunk, n - c * kChunk));
  }, 1);
  double s = 0;
  for (double v : partial) s += v;
  return s;
}

void adamw_shard(ModelParams& params, dist::Range shard, const float* g, float* m, float* v, int64_t t, double lr,
                 const AdamWOptions& o, float grad_scale, ThreadPool* pool) {
  struct Item {
    size_t tensor;
    int64_t begin, end;  // flat indices into params.data()
  };
  std::vector<Item> items;
  const auto& ps = params.tensors();
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t lo = std::max(shard.begin, ps[i].offset), hi = std::min(shard.end, ps[i].offset + ps[i].size);
    for (int64_t b = lo; b < hi; b += kChunk) items.push_back({i, b, std::min(hi, b + kChunk)});
  }
  float* p = params.data();
  parallel_for(pool, static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const Item& item = items[it];
      const double wd = ps[item.tensor].is_matrix || o.decay_vectors ? o.weight_decay : 0.0;
      const AdamWStep s = adamw_scalars(t, lr, o.beta1, o.beta2, o.eps, wd, grad_scale);
      for (int64_t j = item.begin; j < item.end; ++j) {
        const int64_t k = j - shard.begin;
        adamw_value(s, p[j], g[k], m[k], v[k]);
      }
    }
  }, 1);
}

double clip_grad_norm(ModelParams& grads, double max_norm, ThreadPool* pool) {
  const double norm = global_grad_norm(grads, pool);
  if (max_norm <= 0) return norm;
  const float c = clip_coefficient(norm, max_norm);
  if (c == 1.0f) return norm;
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

float clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return max_norm <= 0 || coef >= 1.0 ? 1.0f : static_cast<float>(coef);
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
