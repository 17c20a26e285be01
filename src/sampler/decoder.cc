// Decoder: Dream's `_sample` step loop over a left-padded canvas, one step per call, with per-position RNG
// streams so the output is a function of (inputs, seed) only, the hooks of spec §3.6 plus a custom policy,
// and Fast-dLLM block decoding with KV-cache forwards and threshold / factor decoding (spec §6).
#include "sampler/decoder.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "core/check.h"
#include "core/clock.h"
#include "core/thread_pool.h"
#include "sampler/filters.h"
#include "sampler/rng.h"
#include "sampler/schedule.h"

namespace dc {
namespace {

using Clock = std::chrono::steady_clock;

ConfidenceKind confidence_kind(Algorithm alg) {
  switch (alg) {
    case Algorithm::kTopkMargin: return ConfidenceKind::kMargin;
    case Algorithm::kEntropy: return ConfidenceKind::kNegEntropy;
    default: return ConfidenceKind::kProbability;  // maskgit_plus, and origin under a custom policy
  }
}

// The padded canvas and the ForwardBatch side arrays (empty when no row needs padding).
struct Canvas {
  int64_t n_rows = 0, n_seq = 0, prompt_width = 0;
  std::vector<int32_t> tokens;     // [n_rows, n_seq]
  std::vector<uint8_t> valid;      // [n_rows, n_seq] 1 = real (prompt or generated), 0 = left pad
  std::vector<int32_t> positions;  // [n_rows, n_seq] cumsum(valid) − 1, pads at 1
  std::vector<int64_t> prompt_lengths, pad_counts;  // [n_rows]
};

Result<Canvas> build_canvas(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                            int64_t n_vocab) {
  if (prompts.empty()) return invalid_argument("prompts: no prompt given");
  Canvas c;
  for (size_t i = 0; i < prompts.size(); ++i) {
    DC_RETURN_IF_ERROR(check_prompt_ids(prompts[i], n_vocab, "prompts[" + std::to_string(i) + "]"));
    c.prompt_width = std::max<int64_t>(c.prompt_width, static_cast<int64_t>(prompts[i].size()));
  }
  DC_ASSIGN_OR_RETURN(c.n_seq, canvas_length(params, c.prompt_width));
  const int64_t repeats = params.num_return_sequences;
  c.n_rows = static_cast<int64_t>(prompts.size()) * repeats;
  c.tokens.assign(static_cast<size_t>(c.n_rows * c.n_seq), params.mask_token_id);
  bool padded = false;
  for (int64_t b = 0; b < c.n_rows; ++b) {
    const std::vector<int32_t>& prompt = prompts[static_cast<size_t>(b / repeats)];
    const int64_t len = static_cast<int64_t>(prompt.size());
    const int64_t pads = c.prompt_width - len;
    int32_t* row = c.tokens.data() + b * c.n_seq;
    std::fill(row, row + pads, params.pad_token_id);
    std::copy(prompt.begin(), prompt.end(), row + pads);
    c.prompt_lengths.push_back(len);
    c.pad_counts.push_back(pads);
    padded |= pads > 0;
  }
  if (padded) {
    c.valid.assign(c.tokens.size(), 1);
    c.positions.assign(c.tokens.size(), 0);
    for (int64_t b = 0; b < c.n_rows; ++b) {
      const int64_t pads = c.pad_counts[static_cast<size_t>(b)];
      for (int64_t i = 0; i < c.n_seq; ++i) {
        const size_t at = static_cast<size_t>(b * c.n_seq + i);
        c.valid[at] = i >= pads ? 1 : 0;
        c.positions[at] = static_cast<int32_t>(i >= pads ? i - pads : 1);
      }
    }
  }
  return c;
}

}  // namespace

Status check_generation_size(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                             int64_t n_vocab) {
  int64_t width = 0;
  for (const auto& prompt : prompts) width = std::max<int64_t>(width, static_cast<int64_t>(prompt.size()));
  if (width > kMaxCanvasLength)
    return out_of_range("prompts: " + std::to_string(width) + " tokens, more than the limit of " +
                        std::to_string(kMaxCanvasLength));
  DC_ASSIGN_OR_RETURN(const int64_t n_seq, canvas_length(params, width));
  const int64_t rows = static_cast<int64_t>(prompts.size()) * params.num_return_sequences;
  if (rows > kMaxGenerationRows)
    return out_of_range("the generation's " + std::to_string(prompts.size()) + " prompts × " +
                        std::to_string(params.num_return_sequences) + " sequences make " + std::to_string(rows) +
                        " rows, more than the limit of " + std::to_string(kMaxGenerationRows) + " per generation");
  if (rows * n_seq > kMaxCanvasLength)
    return out_of_range("the generation's " + std::to_string(rows) + " rows × " + std::to_string(n_seq) +
                        " positions exceed the limit of " + std::to_string(kMaxCanvasLength) + " canvas positions");
  // The first step of a block asks for the logits of every masked position of its window.
  const int64_t new_tokens = n_seq - width;
  const int64_t window = params.block_length > 0 ? std::min(params.block_length, new_tokens) : new_tokens;
  const double bytes = static_cast<double>(rows) * static_cast<double>(window) * static_cast<double>(n_vocab) * 4.0;
  if (bytes > static_cast<double>(kMaxStepLogitsBytes)) {
    char gib[64];
    std::snprintf(gib, sizeof(gib), "%.1f GiB", bytes / static_cast<double>(int64_t{1} << 30));
    return out_of_range("a step over " + std::to_string(rows) + " rows × " + std::to_string(window) +
                        " masked positions needs " + gib + " of logits (vocabulary " + std::to_string(n_vocab) +
                        "), more than the limit of " + std::to_string(kMaxStepLogitsBytes >> 30) +
                        " GiB; generate fewer tokens or rows, or decode in blocks (block_length)");
  }
  return Status::ok_status();
}

namespace {

// Positions of one step, row-major, with per-row offsets.
struct PositionSet {
  std::vector<MaskedPosition> positions;
  std::vector<int64_t> row_begin;  // [n_rows + 1]
};

// The masked positions of [begin, end) in every row.
PositionSet masked_positions(const Canvas& c, int32_t mask_id, int64_t begin, int64_t end) {
  PositionSet set;
  set.row_begin.reserve(static_cast<size_t>(c.n_rows + 1));
  for (int64_t b = 0; b < c.n_rows; ++b) {
    set.row_begin.push_back(static_cast<int64_t>(set.positions.size()));
    const int32_t* row = c.tokens.data() + b * c.n_seq;
    for (int64_t i = begin; i < end; ++i) {
      if (row[i] == mask_id) set.positions.push_back({b, i});
    }
  }
  set.row_begin.push_back(static_cast<int64_t>(set.positions.size()));
  return set;
}

// Origin: keep the positions whose u ~ U[0,1) (own stream per position) is below p.
PositionSet origin_transfers(const PositionSet& masked, int64_t n_rows, float p, uint64_t seed, int step) {
  PositionSet set;
  for (int64_t b = 0; b < n_rows; ++b) {
    set.row_begin.push_back(static_cast<int64_t>(set.positions.size()));
    for (int64_t e = masked.row_begin[b]; e < masked.row_begin[b + 1]; ++e) {
      const MaskedPosition& mp = masked.positions[static_cast<size_t>(e)];
      Rng rng = Rng::for_stream(seed, RngPurpose::kTransfer, step, mp.row, mp.position);
      if (rng.uniform_float() < p) set.positions.push_back(mp);
    }
  }
  set.row_begin.push_back(static_cast<int64_t>(set.positions.size()));
  return set;
}

// Per-step working memory, reused across steps.
struct StepBuffers {
  std::vector<int64_t> out_rows;    // [n_out] flat canvas indices asked of the model
  std::vector<int64_t> out_of;      // [n] which out row each sampled position reads
  HeadSampler* head = nullptr;      // the forward's hidden rows (set_head), or null
  int64_t first_row = 0;            // out row 0 is head's hidden row first_row
  std::vector<HeadRow> head_rows;   // [n] what head->sample() draws
  std::vector<TokenSample> samples;  // [n]
  std::vector<float> logits;        // [n, n_vocab] one row per position, only for a logits_hook
  std::vector<float> dedup_logits;  // [n_out, n_vocab] when a logits_hook's positions share a row
  std::vector<int32_t> proposed;    // [n]
  std::vector<float> confidence;    // [n]
};

// What one forward computes: the cache op and the window of positions (with cache committed, maybe only
// some of them, per row).
struct ForwardPlan {
  CacheOp op = CacheOp::kNone;
  int64_t window_begin = 0, window_end = -1;
  std::vector<int64_t> positions;  // ascending, inside the window; empty = all of it
  std::vector<int64_t> row_begin;  // [n_rows + 1] row b's list is positions[row_begin[b], row_begin[b + 1]);
                                   // empty = positions is every row's list
};

// Cache committed (dKV-Cache's delayed caching inside Fast-dLLM's dual window [begin, end)): the positions
// of the window whose K/V a step recomputes, per row: in a row with a masked position there, every masked
// one, every one whose token changed since its K/V were computed (`kv_tokens`, [n_rows, n_seq]: committed
// since, or written by a tokens_hook), and j − 1 of each masked j (its logits' row); none in a row without
// (nothing of it is sampled; its stale positions wait for its next forward or the refresh). The rest is read
// from the cache. Into plan.positions / row_begin: one list when every row's is the same (empty when that is
// the whole window: the forward is then dual's), else each row's own.
void stale_positions(const Canvas& c, const std::vector<int32_t>& kv_tokens, int32_t mask_id, int64_t begin,
                     int64_t end, ForwardPlan& plan) {
  std::vector<int64_t>& out = plan.positions;
  out.clear();
  plan.row_begin.assign(1, 0);
  std::vector<uint8_t> need(static_cast<size_t>(end - begin));
  for (int64_t b = 0; b < c.n_rows; ++b) {
    const int32_t* row = c.tokens.data() + b * c.n_seq;
    const int32_t* kv = kv_tokens.data() + b * c.n_seq;
    std::fill(need.begin(), need.end(), 0);
    bool masked = false;
    for (int64_t i = begin; i < end; ++i) {
      if (row[i] == mask_id) need[static_cast<size_t>(std::max(i - 1, begin) - begin)] = 1, masked = true;
      if (row[i] == mask_id || row[i] != kv[i]) need[static_cast<size_t>(i - begin)] = 1;
    }
    for (int64_t i = begin; i < end && masked; ++i)
      if (need[static_cast<size_t>(i - begin)]) out.push_back(i);
    plan.row_begin.push_back(static_cast<int64_t>(out.size()));
  }
  // Every row's list row 0's: keep that one list.
  const int64_t width = plan.row_begin[1];
  bool same = true;
  for (int64_t b = 1; b < c.n_rows && same; ++b)
    same = plan.row_begin[b + 1] - plan.row_begin[b] == width &&
           std::equal(out.begin(), out.begin() + width, out.begin() + plan.row_begin[b]);
  if (!same) return;
  out.resize(static_cast<size_t>(width));
  plan.row_begin.clear();
  if (width == end - begin) out.clear();  // all of it: the plain window
}

// The k entries of [begin, end) with the largest confidence, ties → lowest position; O(n).
void select_top_k(const std::vector<float>& confidence, int64_t begin, int64_t end, int64_t k,
                  std::vector<int64_t>& chosen) {
  std::vector<int64_t> idx(static_cast<size_t>(end - begin));
  for (int64_t e = begin; e < end; ++e) idx[static_cast<size_t>(e - begin)] = e;
  // Entries of a row are in ascending position order, so the entry index breaks ties by position.
  auto before = [&](int64_t a, int64_t b) {
    const float ca = confidence[static_cast<size_t>(a)], cb = confidence[static_cast<size_t>(b)];
    return ca > cb || (ca == cb && a < b);
  };
  if (k < static_cast<int64_t>(idx.size())) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), before);
  chosen.insert(chosen.end(), idx.begin(), idx.begin() + k);
}

// Parallel decoding (threshold / factor, spec §6): how many of the confidences [begin, end) of one row
// to commit, at least 1 when there is any. Threshold: those >= threshold. Factor: with c_1 >= c_2 >= …,
// the largest n with (n + 1)·(1 − c_n) < factor (a prefix: the left side grows with n).
int64_t parallel_count(const std::vector<float>& confidence, int64_t begin, int64_t end, const SamplingParams& p,
                       std::vector<float>& scratch) {
  if (end <= begin) return 0;
  int64_t n = 0;
  if (p.threshold > 0.0f) {
    for (int64_t e = begin; e < end; ++e) n += confidence[static_cast<size_t>(e)] >= p.threshold ? 1 : 0;
  } else {
    scratch.assign(confidence.begin() + begin, confidence.begin() + end);
    std::sort(scratch.begin(), scratch.end(), std::greater<float>());
    while (n < end - begin &&
           static_cast<double>(n + 2) * (1.0 - static_cast<double>(scratch[static_cast<size_t>(n)])) <
               static_cast<double>(p.factor)) {
      ++n;  // c_{n+1} = scratch[n] passes: (n + 2)(1 − c_{n+1}) < factor
    }
  }
  return std::max<int64_t>(n, 1);
}

// One region decoded with its own step budget: the whole canvas (reference decoding) or a block.
struct Block {
  int64_t begin = 0, end = 0;  // positions [begin, end) of every row
  int n_steps = 0;             // fixed steps; with parallel decoding the cap end − begin
};

// The blocks of spec §6 (the rules at generate() in generate.h).
Result<std::vector<Block>> plan_blocks(const SamplingParams& p, const Canvas& c) {
  const bool parallel = parallel_decoding(p);
  if (p.block_length <= 0 && p.cache == CacheMode::kNone && !parallel) return std::vector<Block>{{0, c.n_seq, p.steps}};
  const int64_t new_tokens = c.n_seq - c.prompt_width;
  const int64_t length = p.block_length > 0 ? p.block_length : new_tokens;
  const int64_t n_blocks = (new_tokens + length - 1) / length;
  DC_RETURN_IF_ERROR(check_steps_per_block(p, new_tokens));
  std::vector<Block> blocks;
  for (int64_t i = 0; i < n_blocks; ++i) {
    Block b;
    b.begin = c.prompt_width + i * length;
    b.end = std::min(b.begin + length, c.n_seq);
    b.n_steps = parallel ? static_cast<int>(b.end - b.begin)
                         : static_cast<int>(p.steps / n_blocks + (i < p.steps % n_blocks ? 1 : 0));
    blocks.push_back(b);
  }
  return blocks;
}

// Maps a policy's answer for `row` to entries of [begin, end); errors name unmask_policy.
Status policy_entries(const std::vector<int64_t>& answer, const PositionSet& set, int64_t begin, int64_t end,
                      int step, int64_t row, std::vector<int64_t>& chosen) {
  const size_t first_new = chosen.size();
  for (int64_t pos : answer) {
    auto lo = set.positions.begin() + begin, hi = set.positions.begin() + end;
    auto it = std::lower_bound(lo, hi, pos, [](const MaskedPosition& a, int64_t p) { return a.position < p; });
    if (it == hi || it->position != pos) {
      return invalid_argument("unmask_policy: at step " + std::to_string(step) + " row " + std::to_string(row) +
                              " it returned position " + std::to_string(pos) +
                              ", which is not a masked position of that row");
    }
    chosen.push_back(it - set.positions.begin());
  }
  std::sort(chosen.begin() + static_cast<std::ptrdiff_t>(first_new), chosen.end());
  auto dup = std::adjacent_find(chosen.begin() + static_cast<std::ptrdiff_t>(first_new), chosen.end());
  if (dup != chosen.end()) {
    return invalid_argument("unmask_policy: at step " + std::to_string(step) + " row " + std::to_string(row) +
                            " it returned position " + std::to_string(set.positions[*dup].position) + " twice");
  }
  return Status::ok_status();
}


}  // namespace

struct Decoder::State {
  int64_t n_vocab = 0;
  SamplingParams params;
  GenerateHooks hooks;
  Canvas c;
  std::vector<Block> blocks;
  bool parallel = false, origin_direct = false;
  int n_steps = 0;
  ConfidenceKind kind = ConfidenceKind::kProbability;
  GenerateOutput out;  // timings, history, committed counts; the canvas goes in at finish()

  // Position in the plan.
  int block = 0, i = 0, step = 0;
  std::vector<float> times;       // the current block's linspace(1, eps, S + 1); empty with parallel
  bool block_started = false;     // times computed and refresh_pending set for `block`
  bool refresh_pending = false;   // the block's first forward refreshes the cache
  int block_forwards = 0;         // forwards run in `block` so far (cache committed's refresh count)
  std::vector<int32_t> kv_tokens;  // cache committed: [n_rows, n_seq] the token each position's cached K/V
                                   // were computed with

  // The prepared step.
  bool prepared = false, finished = false;
  bool last = false, sample = false;
  int64_t k = 0;
  PositionSet to_sample;
  ForwardPlan plan;
  StepBuffers buf;
  std::vector<int64_t> chosen;
  std::vector<MaskedPosition> committed;
  std::vector<float> sort_scratch;

  Status check_canvas(int at_step) const {
    for (size_t at = 0; at < c.tokens.size(); ++at) {
      if (c.tokens[at] < 0 || c.tokens[at] >= n_vocab) {
        return invalid_argument("tokens_hook: at step " + std::to_string(at_step) + " it wrote token id " +
                                std::to_string(c.tokens[at]) + " at row " + std::to_string(at / c.n_seq) +
                                " position " + std::to_string(at % c.n_seq) + ", outside [0, " +
                                std::to_string(n_vocab) + ")");
      }
    }
    return Status::ok_status();
  }
  Status call_tokens_hook(int at_step) {
    if (!hooks.tokens_hook) return Status::ok_status();
    hooks.tokens_hook(TokensHookArgs{at_step, n_steps, c.n_rows, c.n_seq, std::span<int32_t>(c.tokens)});
    return check_canvas(at_step);
  }

  // Cache committed: the forward just run computed K/V of the canvas's current tokens at its positions.
  void note_computed_tokens() {
    if (plan.op == CacheOp::kRefresh) {
      kv_tokens = c.tokens;
      return;
    }
    for (int64_t b = 0; b < c.n_rows; ++b) {
      const auto note = [&](int64_t i) {
        kv_tokens[static_cast<size_t>(b * c.n_seq + i)] = c.tokens[static_cast<size_t>(b * c.n_seq + i)];
      };
      if (!plan.row_begin.empty()) {
        for (int64_t e = plan.row_begin[b]; e < plan.row_begin[b + 1]; ++e) note(plan.positions[e]);
      } else if (!plan.positions.empty()) {
        for (int64_t i : plan.positions) note(i);
      } else {
        for (int64_t i = plan.window_begin; i < plan.window_end; ++i) note(i);
      }
    }
  }

  // The parts of Decoder::step, in order (`step` is still the step being done until after_step). `drawn`: the
  // head's samples of head_args()'s rows, drawn by the caller (null: sample_step draws them).
  HeadSampling head_args();
  Status sample_step(std::span<const TokenSample> const* drawn);
  Status run_step(std::span<const TokenSample> const* drawn, double drawn_ms);
  Status choose();
  void commit();
  Status after_step(int at_step);
};

Decoder::Decoder(std::unique_ptr<State> state) : s_(std::move(state)) {}
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;
Decoder::~Decoder() = default;

Result<Decoder> Decoder::start(int64_t n_vocab, const std::vector<std::vector<int32_t>>& prompts,
                               const SamplingParams& params, const GenerateHooks& hooks) {
  DC_RETURN_IF_ERROR(validate(params, n_vocab));
  DC_RETURN_IF_ERROR(check_generation_size(prompts, params, n_vocab));
  auto s = std::make_unique<State>();
  s->n_vocab = n_vocab;
  s->params = params;
  s->hooks = hooks;
  DC_ASSIGN_OR_RETURN(s->c, build_canvas(prompts, params, n_vocab));
  DC_ASSIGN_OR_RETURN(s->blocks, plan_blocks(params, s->c));
  s->parallel = parallel_decoding(params);
  s->n_steps = s->parallel ? static_cast<int>(s->c.n_seq - s->c.prompt_width) : params.steps;
  s->origin_direct = params.alg == Algorithm::kOrigin && !hooks.unmask_policy && !s->parallel;
  s->kind = s->parallel ? ConfidenceKind::kProbability : confidence_kind(params.alg);
  DC_RETURN_IF_ERROR(s->call_tokens_hook(-1));
  return Decoder(std::move(s));
}

void Decoder::prepare() {
  State& s = *s_;
  if (s.prepared || s.finished) return;
  const SamplingParams& params = s.params;
  const Canvas& c = s.c;
  PositionSet masked;
  for (;;) {
    if (s.block >= static_cast<int>(s.blocks.size())) {
      s.finished = true;
      return;
    }
    const Block& blk = s.blocks[static_cast<size_t>(s.block)];
    if (!s.block_started) {
      s.times = s.parallel ? std::vector<float>() : timesteps(blk.n_steps, params.eps);
      s.refresh_pending = params.cache != CacheMode::kNone;
      s.block_forwards = 0;
      s.block_started = true;
    }
    if (s.i < blk.n_steps) {
      masked = masked_positions(c, params.mask_token_id, blk.begin, blk.end);
      if (!(s.parallel && masked.positions.empty())) break;  // else every row finished the block
    }
    ++s.block;
    s.i = 0;
    s.block_started = false;
  }
  const Block& blk = s.blocks[static_cast<size_t>(s.block)];
  const int i = s.i;
  s.last = !s.parallel && i == blk.n_steps - 1;
  const float t = s.parallel ? 1.0f : s.times[static_cast<size_t>(i)];
  const float sv = s.parallel ? 0.0f : s.times[static_cast<size_t>(i) + 1];
  s.to_sample = s.origin_direct ? origin_transfers(masked, c.n_rows, origin_transfer_probability(t, sv, s.last),
                                                   params.seed, s.step)
                                : std::move(masked);
  const size_t n = s.to_sample.positions.size();
  // The confidence algorithms' count k depends only on the masked counts, so a step that commits
  // nothing (k = 0, e.g. step 0 of 256 tokens / 256 steps) needs no forward either.
  s.k = 0;
  if (!s.origin_direct && !s.parallel) {
    const float avg_masked = static_cast<float>(s.to_sample.positions.size()) / static_cast<float>(c.n_rows);
    s.k = transfer_count(avg_masked, t, sv, s.last);
  }
  s.sample = n > 0 && (s.origin_direct || s.parallel || s.hooks.unmask_policy || s.last || s.k > 0);
  s.plan.op = CacheOp::kNone;
  s.plan.window_begin = 0;
  s.plan.window_end = -1;
  s.plan.positions.clear();
  s.plan.row_begin.clear();
  StepBuffers& buf = s.buf;
  buf.out_rows.clear();
  if (s.sample) {
    if (params.cache != CacheMode::kNone) {
      if (s.refresh_pending) {
        s.plan.op = CacheOp::kRefresh;
      } else {
        s.plan.op = CacheOp::kUse;
        s.plan.window_begin = std::max<int64_t>(blk.begin - 1, 0);
        s.plan.window_end = params.cache == CacheMode::kPrefix ? c.n_seq : blk.end;
        if (params.cache == CacheMode::kCommitted && s.block_forwards % params.refresh_every != 0)
          stale_positions(c, s.kv_tokens, params.mask_token_id, s.plan.window_begin, blk.end, s.plan);
      }
    }
    // The shifted logits of every sampled position: row j − 1 for position j (j = 0 uses its own row).
    buf.out_of.resize(n);
    for (size_t e = 0; e < n; ++e) {
      const MaskedPosition& mp = s.to_sample.positions[e];
      const int64_t src = mp.row * c.n_seq + std::max<int64_t>(mp.position - 1, 0);
      if (buf.out_rows.empty() || buf.out_rows.back() != src) buf.out_rows.push_back(src);  // sorted input
      buf.out_of[e] = static_cast<int64_t>(buf.out_rows.size()) - 1;
    }
  }
  buf.head = nullptr;
  s.prepared = true;
}

bool Decoder::done() const { return s_->finished; }
bool Decoder::needs_forward() const { return s_->prepared && s_->sample; }

ForwardBatch Decoder::forward_batch() const {
  const State& s = *s_;
  ForwardBatch batch;
  batch.n_batch = s.c.n_rows;
  batch.n_seq = s.c.n_seq;
  batch.tokens = s.c.tokens.data();
  batch.positions = s.c.positions.empty() ? nullptr : s.c.positions.data();
  batch.valid = s.c.valid.empty() ? nullptr : s.c.valid.data();
  batch.out_rows = s.buf.out_rows.data();
  batch.n_out = static_cast<int64_t>(s.buf.out_rows.size());
  batch.cache_op = s.plan.op;
  batch.window_begin = s.plan.window_begin;
  batch.window_end = s.plan.window_end;
  if (!s.plan.positions.empty()) {
    batch.window_positions = s.plan.positions.data();
    batch.n_window_positions = static_cast<int64_t>(s.plan.positions.size());
    if (!s.plan.row_begin.empty()) batch.window_row_begin = s.plan.row_begin.data();
  }
  return batch;
}

void Decoder::set_head(HeadSampler* head, int64_t first_row) {
  s_->buf.head = head;
  s_->buf.first_row = first_row;
}

void Decoder::set_pool(ThreadPool* pool) { s_->hooks.pool = pool; }

void Decoder::record_forward(double ms, int64_t positions_computed) {
  GenerateTimings& t = s_->out.timings;
  t.forward_ms += ms;
  ++t.forwards;
  if (s_->plan.op == CacheOp::kRefresh) ++t.cache_refreshes;
  t.positions_computed += positions_computed;
}

std::optional<HeadSampling> Decoder::head_sampling() {
  DC_CHECK(s_->prepared && !s_->finished, "Decoder::head_sampling: call prepare() first, and not after done()");
  if (!s_->sample || s_->hooks.logits_hook) return std::nullopt;
  return s_->head_args();
}

Status Decoder::step() { return s_->run_step(nullptr, 0.0); }

Status Decoder::step(std::span<const TokenSample> samples, double sample_ms) {
  DC_CHECK(s_->sample && !s_->hooks.logits_hook && samples.size() == s_->to_sample.positions.size(),
           "Decoder::step: the samples of head_sampling()'s rows, one each");
  return s_->run_step(&samples, sample_ms);
}

Status Decoder::State::run_step(std::span<const TokenSample> const* drawn, double drawn_ms) {
  DC_CHECK(prepared && !finished, "Decoder::step: call prepare() first, and not after done()");
  const int at_step = step;
  const Clock::time_point t_smp = Clock::now();
  if (sample) DC_RETURN_IF_ERROR(sample_step(drawn));
  DC_RETURN_IF_ERROR(choose());
  commit();
  out.timings.sampling_ms += ms_since(t_smp) + drawn_ms;
  prepared = false;
  ++i;
  ++step;
  return after_step(at_step);
}

// The head sampling of the step's positions: each reads its out row's hidden row, with the request's settings.
HeadSampling Decoder::State::head_args() {
  DC_CHECK(buf.head != nullptr, "Decoder::step: the step needs a forward; call set_head() first");
  const size_t n = to_sample.positions.size();
  buf.head_rows.resize(n);
  for (size_t e = 0; e < n; ++e) {
    const MaskedPosition& mp = to_sample.positions[e];
    buf.head_rows[e] = HeadRow{buf.first_row + buf.out_of[e], mp.row, mp.position};
  }
  return HeadSampling{FilterConfig{params.temperature, params.top_p, params.top_k}, kind, params.seed, step, buf.head_rows};
}

// The proposed tokens and confidences of every position to sample: from the head's chunks, or, with a
// logits_hook, from whole rows (expanded where positions share a row) that the hook may edit first.
Status Decoder::State::sample_step(std::span<const TokenSample> const* drawn) {
  const size_t n = to_sample.positions.size();
  const size_t v = static_cast<size_t>(n_vocab);
  HeadSampling args = head_args();
  refresh_pending = false;
  ++block_forwards;
  if (params.cache == CacheMode::kCommitted) note_computed_tokens();
  buf.samples.resize(n);
  if (drawn != nullptr) {
    std::copy(drawn->begin(), drawn->end(), buf.samples.begin());
  } else if (!hooks.logits_hook) {
    DC_RETURN_IF_ERROR(buf.head->sample(args, buf.samples));
  } else {
    // The full path: one row per position in our own buffer, which the hook may write.
    const size_t n_out = buf.out_rows.size();
    if (buf.logits.size() < n * v) buf.logits.resize(n * v);
    if (n_out == n) {
      DC_RETURN_IF_ERROR(buf.head->logits(buf.first_row, static_cast<int64_t>(n_out), buf.logits.data()));
    } else {  // positions shared a row (j = 0 and 1)
      if (buf.dedup_logits.size() < n_out * v) buf.dedup_logits.resize(n_out * v);
      DC_RETURN_IF_ERROR(buf.head->logits(buf.first_row, static_cast<int64_t>(n_out), buf.dedup_logits.data()));
      for (size_t e = 0; e < n; ++e)
        std::memcpy(buf.logits.data() + e * v, buf.dedup_logits.data() + static_cast<size_t>(buf.out_of[e]) * v,
                    v * sizeof(float));
    }
    hooks.logits_hook(LogitsHookArgs{step, n_steps, c.n_rows, c.n_seq, n_vocab,
                                     std::span<const int32_t>(c.tokens),
                                     std::span<const MaskedPosition>(to_sample.positions),
                                     std::span<float>(buf.logits.data(), n * v)});
    for (size_t e = 0; e < n; ++e) buf.head_rows[e].hidden_row = static_cast<int64_t>(e);
    DC_RETURN_IF_ERROR(sample_head_rows(args, 0, static_cast<int64_t>(n), buf.logits.data(), 0, n_vocab, hooks.pool,
                                        buf.samples));
  }
  buf.proposed.resize(n);
  buf.confidence.resize(n);
  for (size_t e = 0; e < n; ++e) {
    buf.proposed[e] = buf.samples[e].token;
    buf.confidence[e] = buf.samples[e].confidence;
  }
  return Status::ok_status();
}

// Which sampled positions commit (indices into to_sample, sorted), per row: all (origin), the policy's,
// the threshold / factor count, k drawn from softmax(confidence / alg_temp), or the top k.
Status Decoder::State::choose() {
  const size_t n = to_sample.positions.size();
  chosen.clear();
  if (origin_direct) {
    for (size_t e = 0; e < n; ++e) chosen.push_back(static_cast<int64_t>(e));
    return Status::ok_status();
  }
  if (!sample) return Status::ok_status();
  for (int64_t b = 0; b < c.n_rows; ++b) {
    const int64_t begin = to_sample.row_begin[b], end = to_sample.row_begin[b + 1];
    const int64_t n_row = end - begin;
    if (n_row == 0) continue;  // (parallel decoding: this row finished the block and waits)
    // min(k, own): never re-mask (the reference's batch-average k can exceed a row's masked count);
    // the last step takes all of the row's own (equal to int(average) when rows agree).
    const int64_t k_row = parallel ? parallel_count(buf.confidence, begin, end, params, sort_scratch)
                          : last   ? n_row
                                   : std::min(k, n_row);
    if (hooks.unmask_policy) {
      std::vector<int64_t> row_positions(static_cast<size_t>(n_row));
      for (int64_t e = begin; e < end; ++e) row_positions[e - begin] = to_sample.positions[e].position;
      PolicyInput input{step,
                        n_steps,
                        b,
                        std::span<const int32_t>(c.tokens.data() + b * c.n_seq, c.n_seq),
                        row_positions,
                        std::span<const float>(buf.confidence.data() + begin, n_row),
                        std::span<const int32_t>(buf.proposed.data() + begin, n_row),
                        k_row};
      DC_RETURN_IF_ERROR(policy_entries(hooks.unmask_policy(input), to_sample, begin, end, step, b, chosen));
    } else if (k_row <= 0) {
      continue;
    } else if (params.alg_temp > 0.0f && !parallel) {
      std::vector<float> log_weights(static_cast<size_t>(n_row));
      for (int64_t e = begin; e < end; ++e) log_weights[e - begin] = buf.confidence[e] / params.alg_temp;
      Rng rng = Rng::for_stream(params.seed, RngPurpose::kSelect, step, b, -1);
      for (int64_t idx : sample_without_replacement(log_weights, k_row, rng)) chosen.push_back(begin + idx);
    } else {
      select_top_k(buf.confidence, begin, end, k_row, chosen);
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return Status::ok_status();
}

// Writes the chosen proposals into the canvas; records the positions unmasked and their count per row.
void Decoder::State::commit() {
  committed.clear();
  std::vector<int64_t> counts(static_cast<size_t>(c.n_rows), 0);
  for (int64_t e : chosen) {
    const MaskedPosition& mp = to_sample.positions[static_cast<size_t>(e)];
    const int32_t token = buf.proposed[static_cast<size_t>(e)];
    c.tokens[static_cast<size_t>(mp.row * c.n_seq + mp.position)] = token;
    if (token != params.mask_token_id) {
      committed.push_back(mp);
      ++counts[static_cast<size_t>(mp.row)];
    }
  }
  out.committed_counts.push_back(std::move(counts));
}

// After step `at_step` committed: tokens_hook, the history, then on_step (false cancels).
Status Decoder::State::after_step(int at_step) {
  DC_RETURN_IF_ERROR(call_tokens_hook(at_step));
  if (params.output_history) out.history.push_back(c.tokens);
  out.timings.steps_run = at_step + 1;
  if (hooks.on_step) {
    const StepInfo info{at_step,
                        n_steps,
                        c.n_rows,
                        c.n_seq,
                        std::span<const int32_t>(c.tokens),
                        std::span<const MaskedPosition>(committed),
                        std::span<const int64_t>(c.prompt_lengths),
                        std::span<const int64_t>(c.pad_counts),
                        block,
                        static_cast<int>(blocks.size())};
    if (!hooks.on_step(info)) {
      return cancelled("cancelled by on_step (it returned false after step " + std::to_string(at_step) + " of " +
                       std::to_string(n_steps) + ")");
    }
  }
  return Status::ok_status();
}

std::span<const int32_t> Decoder::canvas() const { return s_->c.tokens; }
int64_t Decoder::n_rows() const { return s_->c.n_rows; }
int64_t Decoder::n_seq() const { return s_->c.n_seq; }
int64_t Decoder::prompt_width() const { return s_->c.prompt_width; }
int Decoder::steps_done() const { return s_->step; }
int Decoder::n_steps() const { return s_->n_steps; }
const GenerateTimings& Decoder::timings() const { return s_->out.timings; }

GenerateOutput Decoder::finish() {
  State& s = *s_;
  GenerateOutput out = std::move(s.out);
  Canvas& c = s.c;
  out.n_rows = c.n_rows;
  out.n_seq = c.n_seq;
  out.prompt_width = c.prompt_width;
  for (int64_t b = 0; b < c.n_rows; ++b) {
    const auto row = c.tokens.begin() + b * c.n_seq;
    out.sequences.emplace_back(row, row + c.n_seq);
    out.generated.emplace_back(row + c.prompt_width, row + c.n_seq);
  }
  out.prompt_lengths = std::move(c.prompt_lengths);
  out.pad_counts = std::move(c.pad_counts);
  return out;
}

}  // namespace dc
