// Temperature, top-p, top-k and softmax over one row; a lazily sorted prefix avoids sorting the vocab. The
// passes over the whole row are row_kernels.h's, compiled for the CPU's level.
#include "sampler/filters.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/check.h"
#include "core/thread_pool.h"
#include "sampler/row_kernels.h"

namespace dc {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using row_kernels::exp_or_zero;

// Strict total order "a comes before b": larger logit first, equal logits by lower id.
struct Before {
  const float* x;
  bool operator()(int32_t a, int32_t b) const { return x[a] > x[b] || (x[a] == x[b] && a < b); }
};

// order[0..sorted()) holds the best ids under Before, in order. Grows on demand: the first request
// with a small count uses one heap pass over the row; later ones partition the remaining ids.
// Precondition: no NaN in x (Before must be a strict weak order).
class SortedPrefix {
 public:
  SortedPrefix(const float* x, int64_t n, std::vector<int32_t>& order) : x_(x), n_(n), order_(order) {}

  int64_t sorted() const { return sorted_; }
  int32_t operator[](int64_t i) const { return order_[static_cast<size_t>(i)]; }

  // Makes at least min(m, n) entries sorted (grows geometrically to amortise repeated requests).
  void ensure(int64_t m) {
    m = std::min(m, n_);
    if (m <= sorted_) return;
    const int64_t target = std::min(n_, std::max({m, 2 * sorted_, int64_t{64}}));
    const Before before{x_};
    if (!full_ && sorted_ == 0 && target * 8 <= n_) {
      heap_select(target);
      return;
    }
    if (!full_) build_full();
    auto first = order_.begin() + sorted_;
    auto mid = order_.begin() + target;
    if (target < n_) std::nth_element(first, mid, order_.end(), before);
    std::sort(first, mid, before);
    sorted_ = target;
  }

 private:
  // The `target` best ids with a bounded heap whose front is the worst kept id. Scanning ids upwards,
  // a later id beats an earlier one only with a strictly larger logit.
  void heap_select(int64_t target) {
    const Before before{x_};
    order_.resize(static_cast<size_t>(target));
    for (int64_t i = 0; i < target; ++i) order_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::make_heap(order_.begin(), order_.end(), before);
    float worst = x_[order_.front()];  // the logit an id must beat to enter
    const auto offer = [&](int64_t i) {
      if (!(x_[i] > worst)) return;
      std::pop_heap(order_.begin(), order_.end(), before);
      order_.back() = static_cast<int32_t>(i);
      std::push_heap(order_.begin(), order_.end(), before);
      worst = x_[order_.front()];
    };
    // Blocks of 64 ids are first tested together (a vectorised compare): past the first blocks almost
    // none holds an id that enters, so the scan costs one compare per id.
    constexpr int64_t kBlock = 64;
    int64_t i = target;
    for (; i + kBlock <= n_; i += kBlock) {
      if (!row_kernels::any_greater(x_ + i, kBlock, worst)) continue;
      for (int64_t j = i; j < i + kBlock; ++j) offer(j);
    }
    for (; i < n_; ++i) offer(i);
    std::sort_heap(order_.begin(), order_.end(), before);
    sorted_ = target;
  }

  // Appends every id not yet in the sorted prefix (those after its last entry).
  void build_full() {
    if (sorted_ == 0) {
      order_.resize(static_cast<size_t>(n_));
      std::iota(order_.begin(), order_.end(), 0);
    } else {
      const Before before{x_};
      const int32_t pivot = order_[static_cast<size_t>(sorted_ - 1)];
      order_.resize(static_cast<size_t>(sorted_));
      order_.reserve(static_cast<size_t>(n_));
      for (int64_t i = 0; i < n_; ++i) {
        if (before(pivot, static_cast<int32_t>(i))) order_.push_back(static_cast<int32_t>(i));
      }
      DC_CHECK(static_cast<int64_t>(order_.size()) == n_, "sorted prefix lost ids");
    }
    full_ = true;
  }

  const float* x_;
  int64_t n_;
  std::vector<int32_t>& order_;
  int64_t sorted_ = 0;
  bool full_ = false;
};

// Number of leading entries of the sorted order that survive top-p then top-k (see the header).
// top_p_on / top_k_on say which filters are active; k is already min(top_k, n).
int64_t surviving_prefix(const float* x, int64_t n, bool top_p_on, float top_p, bool top_k_on, int64_t k,
                         SortedPrefix& prefix) {
  prefix.ensure(top_k_on ? k : 64);
  const float max = x[prefix[0]];
  const double z = top_p_on ? row_kernels::sum_exp(x, n, max) : 1.0;
  double cum = 0.0;  // c[i−1] of the reference: mass of the sorted tokens before i
  int64_t i = 0;
  for (; i < n; ++i) {
    if (i >= prefix.sorted()) prefix.ensure(i + 1);
    const int32_t id = prefix[i];
    if (top_k_on && i >= k && x[id] < x[prefix[k - 1]]) break;
    if (top_p_on && i > 0 && static_cast<float>(cum) > top_p) break;
    if (top_p_on) cum += static_cast<float>(exp_or_zero(x[id] - max) / z);
  }
  return i;
}

}  // namespace

void apply_temperature(float* logits, int64_t n_vocab, float temperature) {
  if (!(temperature > 0.0f)) return;
  for (int64_t i = 0; i < n_vocab; ++i) logits[i] /= temperature;
}

void top_p_filter(float* logits, int64_t n_vocab, float top_p, FilterScratch& scratch) {
  if (!(top_p < 1.0f) || n_vocab <= 1) return;
  SortedPrefix prefix(logits, n_vocab, scratch.order);
  const int64_t kept = surviving_prefix(logits, n_vocab, true, top_p, false, 0, prefix);
  if (kept >= n_vocab) return;
  const Before before{logits};
  const int32_t pivot = prefix[kept - 1];
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (before(pivot, static_cast<int32_t>(i))) logits[i] = -kInf;
  }
}

void top_k_filter(float* logits, int64_t n_vocab, int64_t top_k, FilterScratch& scratch) {
  if (top_k <= 0 || top_k >= n_vocab) return;
  scratch.values.assign(logits, logits + n_vocab);
  auto nth = scratch.values.begin() + (top_k - 1);
  std::nth_element(scratch.values.begin(), nth, scratch.values.end(), std::greater<float>());
  const float threshold = *nth;
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (logits[i] < threshold) logits[i] = -kInf;
  }
}

void softmax_in_place(float* x, int64_t n) {
  const float max = *std::max_element(x, x + n);
  row_kernels::normalize(x, n, row_kernels::exp_rows(x, nullptr, n, max, x));
}

Status filtered_distribution(float* logits, int64_t n_vocab, const FilterConfig& config, FilterScratch& scratch) {
  DC_CHECK(n_vocab >= 1, "filtered_distribution needs n_vocab >= 1");
  // Temperature, the finiteness check and the max in one pass.
  bool bad = false;
  const float max = row_kernels::scan_row(logits, n_vocab, config.temperature > 0.0f, config.temperature, bad);
  if (bad) {
    int64_t at = 0;
    while (at < n_vocab && logits[at] < kInf) ++at;
    return invalid_argument("logits: token " + std::to_string(at) + " has a NaN or +inf logit" +
                            (config.temperature > 0.0f ? " after dividing by temperature" : "") +
                            " (a broken model output, a logits_hook bug, or a temperature too close to 0)");
  }
  if (max == -kInf) return invalid_argument("logits: every token has logit -inf, nothing can be sampled");

  const bool top_p_on = config.top_p < 1.0f && n_vocab > 1;
  const bool top_k_on = config.top_k > 0 && config.top_k < n_vocab;
  scratch.ids.clear();
  if (!top_p_on && !top_k_on) {
    scratch.ids.resize(static_cast<size_t>(n_vocab));
    std::iota(scratch.ids.begin(), scratch.ids.end(), 0);
  } else {
    SortedPrefix prefix(logits, n_vocab, scratch.order);
    const int64_t kept = surviving_prefix(logits, n_vocab, top_p_on, config.top_p, top_k_on, config.top_k, prefix);
    scratch.ids.resize(static_cast<size_t>(kept));
    for (int64_t i = 0; i < kept; ++i) scratch.ids[static_cast<size_t>(i)] = prefix[i];
  }
  // Softmax over the survivors (the max survives every filter); without filters ids = 0, 1, ...: the row
  // read in order.
  const int64_t m = static_cast<int64_t>(scratch.ids.size());
  scratch.probs.resize(static_cast<size_t>(m));
  const int32_t* ids = top_p_on || top_k_on ? scratch.ids.data() : nullptr;
  row_kernels::normalize(scratch.probs.data(), m, row_kernels::exp_rows(logits, ids, m, max, scratch.probs.data()));
  return Status::ok_status();
}

Result<TokenSample> sample_token(float* logits, int64_t n_vocab, const FilterConfig& config, ConfidenceKind kind,
                                 Rng& rng, FilterScratch& scratch) {
  DC_RETURN_IF_ERROR(filtered_distribution(logits, n_vocab, config, scratch));
  const std::vector<int32_t>& ids = scratch.ids;
  const std::vector<float>& probs = scratch.probs;
  size_t chosen = 0;
  if (config.temperature > 0.0f) {
    chosen = static_cast<size_t>(sample_categorical(probs, rng));
  } else {
    for (size_t i = 1; i < ids.size(); ++i) {
      if (probs[i] > probs[chosen] || (probs[i] == probs[chosen] && ids[i] < ids[chosen])) chosen = i;
    }
  }
  TokenSample out;
  out.token = ids[chosen];
  switch (kind) {
    case ConfidenceKind::kProbability:
      out.confidence = probs[chosen];
      break;
    case ConfidenceKind::kMargin: {
      float top1 = 0.0f, top2 = 0.0f;
      for (float p : probs) {
        if (p > top1) {
          top2 = top1;
          top1 = p;
        } else if (p > top2) {
          top2 = p;
        }
      }
      out.confidence = top1 - top2;
      break;
    }
    case ConfidenceKind::kNegEntropy: {
      double sum = 0.0;
      for (float p : probs) sum += static_cast<double>(p) * std::log(static_cast<double>(p) + 1e-10);
      out.confidence = static_cast<float>(sum);
      break;
    }
  }
  return out;
}

Status sample_head_rows(const HeadSampling& args, int64_t begin, int64_t end, float* logits, int64_t first_row,
                        int64_t n_vocab, ThreadPool* pool, std::span<TokenSample> out) {
  const std::span<const HeadRow> rows = args.rows;
  std::vector<Status> errors(static_cast<size_t>(end - begin));
  auto shared = [&](int64_t e) {
    const int64_t h = rows[e].hidden_row;
    return (e > begin && rows[e - 1].hidden_row == h) || (e + 1 < end && rows[e + 1].hidden_row == h);
  };
  auto run = [&](int64_t b, int64_t e_end) {
    FilterScratch scratch;
    for (int64_t e = begin + b; e < begin + e_end; ++e) {
      const HeadRow& r = rows[e];
      float* row = logits + (r.hidden_row - first_row) * n_vocab;
      if (shared(e)) {  // the temperature overwrites the row: the other entry needs it intact
        scratch.row.assign(row, row + n_vocab);
        row = scratch.row.data();
      }
      Rng rng = Rng::for_stream(args.seed, RngPurpose::kToken, args.step, r.row, r.position);
      Result<TokenSample> s = sample_token(row, n_vocab, args.filter, args.kind, rng, scratch);
      if (s.ok()) out[e] = *s;
      else errors[static_cast<size_t>(e - begin)] = s.status();
    }
  };
  if (pool != nullptr) pool->parallel_for(end - begin, run, 1);
  else run(0, end - begin);
  for (int64_t e = begin; e < end; ++e) {
    if (!errors[static_cast<size_t>(e - begin)].ok())
      return errors[static_cast<size_t>(e - begin)].with_context(
          "step " + std::to_string(args.step) + " row " + std::to_string(rows[e].row) + " position " +
          std::to_string(rows[e].position));
  }
  return Status::ok_status();
}

}  // namespace dc
