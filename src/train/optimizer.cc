// AdamW, gradient clipping and learning-rate schedules.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
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

// Σ x² of chunks x[c] [n[c]] for c < count ≤ kGroup, into out[c]: per chunk 8 double lanes (vectorisable),
// lane l taking values j + l in order, the last n % 8 values lane 0, the lanes combined in a fixed order.
// A group of kGroup chunks goes through one loop while all have values left: their sums are independent,
// so the loads keep coming (one chunk alone waits on its adds: 15 vs 22 GB/s over 1.5 GB on 2 threads
// here), and each chunk's sums are the same bit for bit.
constexpr int kGroup = 4;
void chunk_sums_of_squares(const float* const* x, const int64_t* n, int count, double* out) {
  double lane[kGroup][8] = {};
  int64_t j0 = 0;  // values [0, j0) of every chunk done in the group loop
  if (count == kGroup) {
    j0 = std::min(std::min(n[0], n[1]), std::min(n[2], n[3])) / 8 * 8;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (int64_t j = 0; j < j0; j += 8)
      for (int l = 0; l < 8; ++l) {
        lane[0][l] += static_cast<double>(x0[j + l]) * x0[j + l];
        lane[1][l] += static_cast<double>(x1[j + l]) * x1[j + l];
        lane[2][l] += static_cast<double>(x2[j + l]) * x2[j + l];
        lane[3][l] += static_cast<double>(x3[j + l]) * x3[j + l];
      }
  }
  for (int c = 0; c < count; ++c) {
    double* ln = lane[c];
    const float* xc = x[c];
    int64_t j = j0;
    for (; j + 8 <= n[c]; j += 8)
      for (int l = 0; l < 8; ++l) ln[l] += static_cast<double>(xc[j + l]) * xc[j + l];
    for (; j < n[c]; ++j) ln[0] += static_cast<double>(xc[j]) * xc[j];
    out[c] = ((ln[0] + ln[1]) + (ln[2] + ln[3])) + ((ln[4] + ln[5]) + (ln[6] + ln[7]));
  }
}

// Σ x² over the chunks chunk(i) = (pointer, size), i < count: partial sums by groups of kGroup, threaded,
// then added in order.
template <typename Chunk>
double sum_of_chunks(int64_t count, const Chunk& chunk, ThreadPool* pool) {
  std::vector<double> partial(static_cast<size_t>(count));
  parallel_for(pool, (count + kGroup - 1) / kGroup, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      const float* x[kGroup];
      int64_t n[kGroup];
      const int m = static_cast<int>(std::min<int64_t>(kGroup, count - g * kGroup));
      for (int c = 0; c < m; ++c) std::tie(x[c], n[c]) = chunk(g * kGroup + c);
      chunk_sums_of_squares(x, n, m, partial.data() + g * kGroup);
    }
  }, 1);
  double s = 0;
  for (double v : partial) s += v;
  return s;
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
  return std::sqrt(sum_of_chunks(static_cast<int64_t>(items.size()), [&](int64_t it) {
    const auto [i, begin] = items[it];
    const float* x = grads.tensors()[i].data + begin;
    return std::pair{x, std::min(kChunk, grads.tensors()[i].size - begin)};
  }, pool));
}

double sum_of_squares(const float* x, int64_t n, ThreadPool* pool) {
  return sum_of_chunks((n + kChunk - 1) / kChunk, [&](int64_t c) {
    return std::pair{x + c * kChunk, std::min(kChunk, n - c * kChunk)};
  }, pool);
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

Status check_finite_in(const std::string& name, double value, double lo, double hi, bool lo_open, bool hi_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && (hi_open ? value < hi : value <= hi);
  if (ok) return Status();
  std::ostringstream os;
  os.precision(17);
  constexpr double kMax = std::numeric_limits<double>::max();
  os << name << ": must be a finite number";
  if (lo > -kMax && hi < kMax)
    os << " in " << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]");
  else if (lo > -kMax)
    os << (lo_open ? " > " : " >= ") << lo;
  os << " (got " << value << ")";
  return invalid_argument(os.str());
}

Status check_optimizer_options(const LrOptions& lr, const AdamWOptions& adam, double max_grad_norm) {
  constexpr double kMax = std::numeric_limits<double>::max();
  DC_RETURN_IF_ERROR(check_finite_in("--lr (lr)", lr.lr, 0.0, kMax));
  DC_RETURN_IF_ERROR(check_finite_in("--min-lr-ratio (min_lr_ratio)", lr.min_lr_ratio, 0.0, 1.0));
  if (lr.warmup_steps < 0)
    return invalid_argument("--warmup-steps (warmup_steps): must be >= 0 (got " + std::to_string(lr.warmup_steps) + ")");
  DC_RETURN_IF_ERROR(check_finite_in("--beta1 (beta1)", adam.beta1, 0.0, 1.0, false, true));
  DC_RETURN_IF_ERROR(check_finite_in("--beta2 (beta2)", adam.beta2, 0.0, 1.0, false, true));
  DC_RETURN_IF_ERROR(check_finite_in("--adam-eps (eps)", adam.eps, 0.0, kMax, true));
  DC_RETURN_IF_ERROR(check_finite_in("--weight-decay (weight_decay)", adam.weight_decay, 0.0, kMax));
  return check_finite_in("--max-grad-norm (max_grad_norm)", max_grad_norm, -kMax, kMax);
}

}  // namespace dc::train
