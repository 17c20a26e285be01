// Decoder: one generation's decoding state (its canvas, params, block plan, RNG streams and step counter),
// advanced one step at a time given the model's head over the rows it asks for. generate() is a loop over
// it, and the server advances many Decoders together from one batched forward, so there is one
// implementation of the rules.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "sampler/generate.h"
#include "types/forward_batch.h"

namespace dc {

class ThreadPool;

// The size limits of generate.h for these prompts and params (rows, canvas positions, the logits of a
// step), computed without allocating: OutOfRange with a message that names the sizes and the limit.
// Decoder::start() calls it; a server calls it to refuse a request before queueing it.
Status check_generation_size(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                             int64_t n_vocab);

class Decoder {
 public:
  // Validates params and prompts, builds the left-padded canvas and the block plan, and calls
  // tokens_hook(step −1). Errors as generate()'s. `hooks` is copied; hooks.pool is used by step().
  static Result<Decoder> start(int64_t n_vocab, const std::vector<std::vector<int32_t>>& prompts,
                               const SamplingParams& params, const GenerateHooks& hooks = {});
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;
  ~Decoder();

  // Moves to the next step that has work (skipping finished blocks). After prepare(), done() tells whether
  // every step has run; otherwise needs_forward() tells whether step() wants logits. Idempotent until step().
  void prepare();
  bool done() const;
  bool needs_forward() const;  // precondition: prepare() was called and !done()

  // The forward the prepared step needs, over this decoder's own canvas ([n_rows, n_seq], its own padding,
  // out_rows deduplicated and ascending, the cache op and window). Pointers are valid until step().
  ForwardBatch forward_batch() const;
  // After the forward: the prepared step's out rows (forward_batch().out_rows, in order) are the hidden
  // rows [first_row, first_row + n_out) of `head` (ops/head_sampler.h; valid until step() returns).
  // step() draws its tokens from head->sample() in the head's chunks, or, with a logits_hook, from the
  // whole rows of head->logits(). Must be called before step() when needs_forward().
  void set_head(HeadSampler* head, int64_t first_row);
  // The pool that parallelises step()'s sampling of a logits_hook's rows (replaces hooks.pool; nullptr =
  // serial; the head samples with its own). Results do not depend on it.
  void set_pool(ThreadPool* pool);
  // Records a forward's cost in timings() (forward_ms, forwards, cache_refreshes, positions_computed).
  void record_forward(double ms, int64_t positions_computed);

  // Samples, selects and commits the prepared step (from set_head()'s rows when needs_forward()), then
  // calls tokens_hook and on_step. Errors: non-finite logits, a bad unmask_policy answer or tokens_hook
  // write, and cancellation by on_step (is_cancelled()). After an error the decoder must not be stepped.
  Status step();
  // For a caller that draws several decoders' tokens in one call (a server's merged step:
  // HeadSampler::sample_parts): the head sampling the prepared step asks of set_head()'s head (its positions'
  // hidden rows, ascending, and this generation's filters, confidence kind, seed and step; the rows valid until
  // step()), or nullopt when the step draws no tokens that way (it needs no forward, or a logits_hook samples
  // whole rows): then step() as above. Precondition: prepare(), and set_head() when needs_forward().
  std::optional<HeadSampling> head_sampling();
  // step() with the head's samples already drawn: samples[i] for head_sampling()'s rows[i] (what step() would
  // draw itself from the same head). `sample_ms`, the time they took, goes into timings().sampling_ms.
  Status step(std::span<const TokenSample> samples, double sample_ms);

  // The live canvas [n_rows, n_seq] (left pads, prompt, generated / masks).
  std::span<const int32_t> canvas() const;
  int64_t n_rows() const;
  int64_t n_seq() const;
  int64_t prompt_width() const;
  int steps_done() const;  // steps run so far
  int n_steps() const;     // params.steps (fixed steps) or the new-token count (threshold / factor)
  const GenerateTimings& timings() const;

  // The result once done(); moves the canvas out (the decoder is then spent).
  GenerateOutput finish();

 private:
  struct State;
  explicit Decoder(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace dc
