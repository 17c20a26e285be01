// Masked-diffusion generation (Dream / DiffuCoder `diffusion_generate`, spec §3): the parameters, the
// hooks, and generate(), which drives a model given as a logits callback over a canvas of mask tokens.
// Deliberate differences from the reference are listed at generate().
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/forward_batch.h"

namespace dc {

class ThreadPool;

// ---------------------------------------------------------------------------------------------------
// Parameters

// How positions are chosen for unmasking each step (spec §3.4).
enum class Algorithm {
  kOrigin,       // "origin": each masked position unmasks with probability 1 − s/t (random order)
  kMaskgitPlus,  // "maskgit_plus": the k positions whose chosen token is most probable
  kTopkMargin,   // "topk_margin": the k positions with the largest top-1 − top-2 probability margin
  kEntropy,      // "entropy": the k positions with the lowest entropy (largest Σ p·log p)
};

// Parses "origin", "maskgit_plus", "topk_margin" or "entropy"; the error lists the valid names.
Result<Algorithm> parse_algorithm(std::string_view name);
const char* algorithm_name(Algorithm alg);

// The reference's EFFECTIVE defaults (spec §3.2: from_model_config picks up transformers' legacy
// top_k = 50 and temperature = 1.0). Token ids default to DiffuCoder's config.json.
struct SamplingParams {
  // Canvas length (spec §3.3), relative to the padded prompt width P:
  //   max_new_tokens set → P + max_new_tokens; else max_length set → max_length (the total);
  //   else P + 20, capped by max_position_embeddings when that is > 0. Must exceed P.
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> max_length;
  int64_t max_position_embeddings = 0;
  int steps = 512;            // >= 1 diffusion steps (one forward each)
  float eps = 1e-3f;          // in (0, 1): the last time of linspace(1, eps, steps + 1)
  Algorithm alg = Algorithm::kOrigin;
  float alg_temp = 0.0f;      // >= 0; > 0: positions drawn from softmax(confidence / alg_temp) instead of top-k
  float temperature = 1.0f;   // >= 0, finite; 0 = greedy
  float top_p = 1.0f;         // in (0, 1]; 1 = off
  int64_t top_k = 50;         // <= 0 = off
  int num_return_sequences = 1;  // >= 1; each prompt is repeated consecutively (repeat_interleave)
  uint64_t seed = 0;          // every random draw is a function of (seed, step, row, position)
  bool output_history = false;   // keep a copy of the canvas after every step
  int32_t mask_token_id = 151666;
  int32_t pad_token_id = 151643;  // left padding of shorter prompts
};

// Rejects out-of-range parameters with a message naming the field (e.g. "top_p: must be in (0, 1] ...").
Status validate(const SamplingParams& params, int64_t n_vocab);

// The total canvas length for a padded prompt width (the rules at SamplingParams); an error when it
// does not exceed prompt_width. Assumes validate() passed.
Result<int64_t> canvas_length(const SamplingParams& params, int64_t prompt_width);

// ---------------------------------------------------------------------------------------------------
// The model and the hooks

// Fills logits [batch.n_out, n_vocab] (row r for flat canvas index batch.out_rows[r] = b·n_seq + i) with
// the model's UNSHIFTED output at that index. generate() asks for index j − 1 to sample position j
// (j = 0 uses its own row; spec §2.6). Called from the thread that called generate().
using LogitsFn = std::function<Status(const ForwardBatch& batch, float* logits)>;

struct MaskedPosition {
  int64_t row = 0;       // canvas row (after num_return_sequences expansion)
  int64_t position = 0;  // index in the row, including left pads
  bool operator==(const MaskedPosition&) const = default;
};

// on_step's view, after the step's commits and tokens_hook.
struct StepInfo {
  int step = 0;                               // 0-based
  int n_steps = 0;
  int64_t n_rows = 0, n_seq = 0;
  std::span<const int32_t> canvas;            // [n_rows, n_seq]
  std::span<const MaskedPosition> committed;  // unmasked this step (row-major order); tokens equal to the
                                              // mask id are not listed (the position stays masked)
  std::span<const int64_t> prompt_lengths;    // [n_rows] real prompt tokens
  std::span<const int64_t> pad_counts;        // [n_rows] left pads
};

// logits_hook's view: the shifted logits about to be sampled, one row per position, editable in place.
struct LogitsHookArgs {
  int step = 0;
  int n_steps = 0;
  int64_t n_rows = 0, n_seq = 0, n_vocab = 0;
  std::span<const int32_t> canvas;            // [n_rows, n_seq] before this step's commits
  std::span<const MaskedPosition> positions;  // [n] the position each logits row is for
  std::span<float> logits;                    // [n, n_vocab]
};

// tokens_hook's view: the whole canvas, editable (e.g. to force a suffix). Token ids written must lie in
// [0, n_vocab); writing mask_token_id masks a position.
struct TokensHookArgs {
  int step = 0;                // −1 for the call before the first step
  int n_steps = 0;
  int64_t n_rows = 0, n_seq = 0;
  std::span<int32_t> canvas;   // [n_rows, n_seq]
};

// A custom unmasking policy's view of one row at one step.
struct PolicyInput {
  int step = 0;
  int n_steps = 0;
  int64_t row = 0;
  std::span<const int32_t> tokens;            // [n_seq] the row before this step's commits
  std::span<const int64_t> masked_positions;  // [n_masked] ascending
  std::span<const float> confidences;         // [n_masked] per the algorithm (origin: token probability)
  std::span<const int32_t> proposed_tokens;   // [n_masked] the token each position would get
  int64_t k = 0;                              // the schedule's count: min(transfer_count, n_masked);
                                              // n_masked on the last step
};

// Returns the positions of the row to commit (each a masked position, no repeats, any count).
using UnmaskPolicy = std::function<std::vector<int64_t>(const PolicyInput&)>;

struct GenerateHooks {
  std::function<bool(const StepInfo&)> on_step;             // after every step; false cancels
  std::function<void(const LogitsHookArgs&)> logits_hook;   // after the forward, before sampling
  std::function<void(const TokensHookArgs&)> tokens_hook;   // before the loop (step −1) and after each step
  UnmaskPolicy unmask_policy;                               // replaces top-k / alg_temp / origin selection
  ThreadPool* pool = nullptr;  // parallelises sampling over masked positions; nullptr = serial.
                               // Results do not depend on it.
};

// ---------------------------------------------------------------------------------------------------
// Generation

struct GenerateTimings {
  double total_ms = 0.0;
  double forward_ms = 0.0;   // inside logits_fn
  double sampling_ms = 0.0;  // logits hook, filters, sampling, selection, commits
  int steps_run = 0;
};

struct GenerateOutput {
  int64_t n_rows = 0;        // prompts × num_return_sequences
  int64_t n_seq = 0;         // canvas length
  int64_t prompt_width = 0;  // the longest prompt; generated tokens start here in every row
  std::vector<std::vector<int32_t>> sequences;  // [n_rows][n_seq]: left pads, prompt, generated
  std::vector<int64_t> prompt_lengths;          // [n_rows]
  std::vector<int64_t> pad_counts;              // [n_rows]
  std::vector<std::vector<int32_t>> generated;  // [n_rows][n_seq − prompt_width], not post-processed
  std::vector<std::vector<int32_t>> history;    // [steps][n_rows · n_seq] if output_history
  std::vector<std::vector<int64_t>> committed_counts;  // [steps_run][n_rows] positions unmasked per step
  GenerateTimings timings;
};

// Runs params.steps diffusion steps over prompts[i] + mask × new tokens and returns the canvases.
// Per step: the masked positions are recomputed; logits_fn is asked only for the rows the sampled
// positions need (index j − 1 for position j, deduplicated); tokens are drawn per spec §3.5 (filters.h); then
//   origin: each masked position unmasks iff u < 1 − s/t (u ~ U[0,1) per position; all on the last step);
//   others: k = transfer_count(batch-average masked count, t, s) and each row unmasks its
//           min(k, own masked) most confident positions (all its own on the last step; ties → lowest
//           position), or draws them from softmax(confidence / alg_temp) without replacement when
//           alg_temp > 0;
//   or unmask_policy decides. Committing the mask id leaves the position masked.
// Rows of different lengths are left-padded with pad_token_id; the ForwardBatch then carries `valid`
// and positions = cumsum(valid) − 1 with pads at 1; with no padding both are nullptr.
// Deliberate differences from the reference: f32 sampling math (reference: bf16); no silent greedy
// fallback of torch.distributions.Categorical; when rows' masked counts differ (hooks, or a committed mask
// id) each row takes min(k, own) and all its own on the last step, so nothing is re-masked and nothing
// stays masked (the reference uses the batch-average k for every row and can re-mask real tokens);
// origin computes logits only for the positions that unmask, and a step that commits nothing (origin
// drew no position, or k = 0 with no unmask_policy) skips the forward (logits_hook is then not called;
// the reference runs the model every step). Neither changes any result.
// Errors: invalid params/prompts, logits_fn errors, non-finite logits, an invalid unmask_policy answer,
// tokens_hook writing an out-of-range id, and cancellation by on_step (is_cancelled() is true).
Result<GenerateOutput> generate(const LogitsFn& logits_fn, int64_t n_vocab,
                                const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                const GenerateHooks& hooks = {});

// True for the Status generate() returns when on_step asked to stop.
bool is_cancelled(const Status& status);

// The prefix of `generated` before the first token in stop_ids (all of it if none occurs).
// Instruct: stop at <|dlm_pad|> (and <|im_end|>); Base: <|endoftext|>. The caller picks the ids.
std::vector<int32_t> truncate_at_stop(const std::vector<int32_t>& generated, const std::vector<int32_t>& stop_ids);

}  // namespace dc
