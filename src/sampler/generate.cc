// generate(): the whole generation as a loop over one Decoder (sampler/decoder.h), which holds the step
// semantics (Dream's `_sample`, the hooks, block decoding, KV-cache forwards, threshold / factor).
#include "sampler/generate.h"

#include <chrono>
#include <new>

#include "sampler/decoder.h"

namespace dc {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Result<GenerateOutput> generate_or_throw(const LogitsFn& logits_fn, int64_t n_vocab,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const SamplingParams& params, const GenerateHooks& hooks) {
  const Clock::time_point t_start = Clock::now();
  DC_ASSIGN_OR_RETURN(Decoder decoder, Decoder::start(n_vocab, prompts, params, hooks));
  for (decoder.prepare(); !decoder.done(); decoder.prepare()) {
    if (decoder.needs_forward()) {
      const ForwardBatch batch = decoder.forward_batch();
      const Clock::time_point t_fwd = Clock::now();
      Status st = logits_fn(batch, decoder.logits_buffer().data());
      decoder.record_forward(ms_since(t_fwd), batch.n_computed());
      if (!st.ok()) return st.with_context("logits_fn at step " + std::to_string(decoder.steps_done()));
    }
    DC_RETURN_IF_ERROR(decoder.step());
  }
  GenerateOutput out = decoder.finish();
  out.timings.total_ms = ms_since(t_start);
  return out;
}

}  // namespace

Result<GenerateOutput> generate(const LogitsFn& logits_fn, int64_t n_vocab,
                                const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                const GenerateHooks& hooks) {
  if (!logits_fn) return invalid_argument("logits_fn: empty function");
  try {
    return generate_or_throw(logits_fn, n_vocab, prompts, params, hooks);
  } catch (const std::bad_alloc&) {  // the canvas, the logits or the sampling buffers
    return resource_exhausted("generate: out of memory for the canvas, logits or sampling buffers of " +
                              std::to_string(prompts.size()) + " prompts; use fewer prompts or new tokens");
  }
}

}  // namespace dc
