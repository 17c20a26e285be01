// HeadSampler: the lm_head and the per-position token sampling of a diffusion step, over the forward's
// final-normed hidden rows, so that a step never holds its [positions × vocabulary] logits at once
// (issue 20) and a backend can keep the logits on its device, handing back O(positions) numbers per step
// (issue 17). Written by the model's backends (the CPU one: engine/head_sampler.h), read by the sampler.
#pragma once

#include <cstdint>
#include <span>

#include "core/check.h"
#include "core/status.h"

namespace dc {

// How a masked position's confidence is measured (larger = unmask first).
enum class ConfidenceKind {
  kProbability,  // maskgit_plus: probability of the chosen token
  kMargin,       // topk_margin: top-1 minus top-2 probability (top-2 = 0 if only one token survives)
  kNegEntropy,   // entropy: Σ p·log(p + 1e-10) = −H (≤ 0)
};

// Dream's `sample_tokens` filters (sampler/filters.h has their exact rules).
struct FilterConfig {
  float temperature = 1.0f;  // > 0: logits are divided by it and the token is sampled; 0: greedy
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  int64_t top_k = 50;        // <= 0 = off; k = min(top_k, n_vocab)
};

// One position's proposal: its token and the confidence of `ConfidenceKind`.
struct TokenSample {
  int32_t token = 0;
  float confidence = 0.0f;
};

// One position to sample. Its logits are lm_head(hidden row `hidden_row`) (several positions may share a
// row); its random draw comes from the stream Rng::for_stream(seed, RngPurpose::kToken, step, row,
// position) of sampler/rng.h, so the result never depends on how positions are grouped or ordered.
struct HeadRow {
  int64_t hidden_row = 0;  // index into the hidden rows of the last forward
  int64_t row = 0;         // canvas row (the RNG stream)
  int64_t position = 0;    // canvas position (the RNG stream; also named in errors)
};

struct HeadSampling {
  FilterConfig filter;
  ConfidenceKind kind = ConfidenceKind::kProbability;
  uint64_t seed = 0;
  int step = 0;
  std::span<const HeadRow> rows;  // [n] hidden_row ascending
};

// The last forward's hidden rows behind an lm_head. A backend implements both functions so that, for
// the same rows, sample() gives exactly what sampler/filters.h's sample_token gives on logits()'s rows:
// the CPU backend computes the lm_head in chunks of rows into a reused [chunk, n_vocab] scratch and
// samples each row of a chunk from it; a GPU backend would compute the logits and the filtered
// distribution on the device and copy back only the n TokenSamples. An implementation must make the
// logits of a row independent of which other rows are asked for in the same call (e.g. chunks counted
// from the first row asked for, the same in both functions), so the two paths agree bit for bit.
// One thread at a time; valid until the forward that made it runs again.
class HeadSampler {
 public:
  virtual ~HeadSampler() = default;

  // Number of hidden rows of the last forward ([n_rows, n_embd], final-normed).
  virtual int64_t n_rows() const = 0;

  // The full path, for callers that need whole rows (logits hooks): writes the unshifted logits of
  // hidden rows [first, first + n) to out[n, n_vocab]. Errors: resource_exhausted, a backend's failure.
  virtual Status logits(int64_t first, int64_t n, float* out) = 0;

  // The chunked path: out[i] = the sample of args.rows[i] (out.size() == args.rows.size()). Errors
  // (non-finite logits, every logit −inf) are those of sample_token, with the step, row and position of
  // the first failing entry in the message.
  virtual Status sample(const HeadSampling& args, std::span<TokenSample> out) = 0;

  // Several requests' steps in one call (a server's merged step: one lm_head pass over all their rows, on a
  // device one submission): parts[p] as sample(parts[p], out_p), where out is out_0, out_1, ... one after the
  // other and the parts' rows, taken in order, have ascending hidden rows (part p's below part p + 1's). Each
  // part keeps its own filter, kind, seed and step, so its entries draw from the same streams as alone; the
  // lm_head of a row is the one sample() computes where the backend's product is row-wise (the CPU's reference
  // kernels, a device's), else within rounding (the CPU's fast kernels: chunks counted from the first part's
  // first row). status[p] (status.size() == parts.size()): part p's errors, those of sample() for its rows, the
  // other parts' results unaffected; the return: a failure of the whole call (memory, the device), after which
  // out holds nothing. The default samples the parts one after the other.
  virtual Status sample_parts(std::span<const HeadSampling> parts, std::span<TokenSample> out, std::span<Status> status) {
    size_t at = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
      status[p] = sample(parts[p], out.subspan(at, parts[p].rows.size()));
      at += parts[p].rows.size();
    }
    return Status::ok_status();
  }

  // Frees the scratch of the last forward (its rows: n_rows() becomes 0); the next forward grows it again.
  // For an owner going idle (the server between batches).
  virtual void release() {}

 protected:
  // sample() as sample_parts() of one part: for a backend whose sample_parts is its one implementation.
  Status sample_as_one_part(const HeadSampling& args, std::span<TokenSample> out) {
    DC_CHECK(out.size() == args.rows.size(), "HeadSampler::sample: out and rows differ in size");
    Status entries;
    DC_RETURN_IF_ERROR(sample_parts({&args, 1}, out, {&entries, 1}));
    return entries;
  }
};

}  // namespace dc
