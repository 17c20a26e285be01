// Masked-diffusion generation (Dream / DiffuCoder `diffusion_generate`, spec §3): the parameters, the
// hooks, and generate(), which drives a model given as a logits callback over a canvas of mask tokens.
// Deliberate differences from the reference are listed at generate().
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "types/forward_batch.h"
#include "ops/head_sampler.h"

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

// Which keys / values the steps of a block recompute (Fast-dLLM's approximate KV cache, spec §6).
enum class CacheMode {
  kNone,    // every forward computes every position (exact w.r.t. the model)
  kPrefix,  // the block's first forward computes every position and caches K/V; its later steps compute
            // [block_begin − 1, n_seq) with the K/V of the positions before from the cache
  kDual,    // as kPrefix, but later steps compute only [block_begin − 1, block_end); the K/V of the prefix
            // and of the masked suffix come from the cache
  kCommitted,  // as kDual, but (dKV-Cache's delayed caching, inside the block) a step between the block's
               // refreshes computes, in each row with a masked block position, only that row's block positions
               // that are masked or whose token changed since their K/V were last computed, plus j − 1 of each
               // masked j (the logits shift); the K/V of the block's other (committed) positions come from the
               // cache too. Every refresh_every-th forward of a block recomputes the whole dual window. CPU only
};

// Parses "none", "prefix", "dual" or "committed"; the error lists the valid names.
Result<CacheMode> parse_cache_mode(std::string_view name);
const char* cache_mode_name(CacheMode mode);

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

  // Fast-dLLM block decoding, approximate KV cache and parallel decoding (spec §6; the exact rules are
  // at generate() and in README "Block decoding, KV cache and parallel decoding"). All off by default.
  int64_t block_length = 0;  // >= 0. > 0: the new tokens are decoded left to right in blocks of this many
                             // (Fast-dLLM: 32). 0: the reference's whole-canvas decoding, unless `cache`
                             // or threshold / factor is on: then one block holds all new tokens
  CacheMode cache = CacheMode::kNone;
  int refresh_every = 4;     // cache committed: forwards f = 1, 2, … of a block (f = 0 is the full refresh) with
                             // f % refresh_every == 0 recompute the whole block window (a dual step); the others
                             // only the masked and newly committed rows. >= 1; 1 = dual token for token. 4: the
                             // reload interval of dKV-Cache's reference code. Unused by the other modes
  float threshold = 0.0f;    // > 0: each step commits every masked position of the block whose
                             // confidence (probability of its token) is >= threshold, at least the most
                             // confident one; blocks then run until they have no mask (`steps` unused).
                             // <= 0: off
  float factor = 0.0f;       // > 0: each step commits the largest n with (n + 1)·(1 − c_n) < factor, c_n
                             // the n-th largest confidence of the block's masked positions, at least 1.
                             // <= 0: off. At most one of threshold and factor may be on
};

// True when threshold or factor decoding is on (blocks then run until no mask is left; steps is unused).
inline bool parallel_decoding(const SamplingParams& p) { return p.threshold > 0.0f || p.factor > 0.0f; }

// The fast mode (`--fast`): Fast-dLLM's published defaults (spec §6) — blocks of 32, the dual KV cache
// and confidence-threshold commits at 0.9 — for each of the three the caller left off (block_length 0,
// cache none, neither threshold nor factor). An approximation of the reference's decoding (README).
inline void apply_fast_mode(SamplingParams& p) {
  if (p.block_length == 0) p.block_length = 32;
  if (p.cache == CacheMode::kNone) p.cache = CacheMode::kDual;
  if (!parallel_decoding(p)) p.threshold = 0.9f;
}

// Limits on sizes that come from outside, checked by validate() / Decoder::start() before anything is
// allocated: steps, completions per prompt, canvas positions (new tokens, max_length), rows of one
// generation, and the f32 logits one step may need ([rows × masked positions of the window, n_vocab]).
inline constexpr int64_t kMaxSteps = int64_t{1} << 20;
inline constexpr int64_t kMaxReturnSequences = 1024;
inline constexpr int64_t kMaxCanvasLength = int64_t{1} << 24;
inline constexpr int64_t kMaxGenerationRows = 4096;
inline constexpr int64_t kMaxStepLogitsBytes = int64_t{8} << 30;

// Rejects out-of-range parameters with a message naming the field (e.g. "top_p: must be in (0, 1] ...").
Status validate(const SamplingParams& params, int64_t n_vocab);

// The total canvas length for a padded prompt width (the rules at SamplingParams); an error when it
// does not exceed prompt_width. Assumes validate() passed.
Result<int64_t> canvas_length(const SamplingParams& params, int64_t prompt_width);

// canvas_length, refused (out_of_range, naming max_position_embeddings) when it is longer than the
// model's context `context` (max_position_embeddings). The one check of Engine::generate and the server.
Result<int64_t> canvas_length_in_context(const SamplingParams& params, int64_t prompt_width, int64_t context);

// Block decoding with fixed steps (block_length > 0, no threshold / factor) needs at least one step per
// block: invalid_argument naming steps when params.steps is smaller than the number of blocks of
// `new_tokens` new tokens. The one check of the decoder and the server.
Status check_steps_per_block(const SamplingParams& params, int64_t new_tokens);

// Every id of a prompt in [0, n_vocab); otherwise invalid_argument
// "<name>: token id X at index j is outside the vocabulary [0, n_vocab)".
Status check_prompt_ids(std::span<const int32_t> ids, int64_t n_vocab, const std::string& name);

// ---------------------------------------------------------------------------------------------------
// The model and the hooks

// Fills logits [batch.n_out, n_vocab] (row r for flat canvas index batch.out_rows[r] = b·n_seq + i) with
// the model's UNSHIFTED output at that index. generate() asks for index j − 1 to sample position j
// (j = 0 uses its own row; spec §2.6). Called from the thread that called generate().
using LogitsFn = std::function<Status(const ForwardBatch& batch, float* logits)>;

// The model as generation uses it by default: runs the forward of `batch` up to its final-normed hidden
// rows (row r for batch.out_rows[r]) and returns the HeadSampler over them (owned by the function, valid
// until its next call), from which each step draws its tokens in chunks, never holding [n_out, n_vocab]
// at once (logits are materialised only for a logits_hook). Called from the thread that called generate().
using HeadFn = std::function<Result<HeadSampler*>(const ForwardBatch& batch)>;
// A HeadFn over several parts in one forward (Model::forward_hidden_parts: each part a batch with its own
// cache, which the caller supplies): the head's rows are part p's out rows after those of parts < p.
using PartsHeadFn = std::function<Result<HeadSampler*>(std::span<const ForwardBatch> parts)>;

// The memory a HeadFn's steps hold: per out row of a forward (its hidden row plus the sampler's numbers
// per position; on a device also the row's hidden and logits rows in device memory) and once per HeadFn (e.g.
// the CPU head's [chunk, n_vocab] logits block). A server budgets its jobs with it. On a device (0 on the CPU,
// whose budget counts the step buffers only) also the device memory per position of a job's canvas: the
// forward's activations (every position is computed by a full or refresh forward) and, for a job with a KV
// cache, its cache's K and V of every layer.
struct HeadMemory {
  int64_t bytes_per_row = 0;
  int64_t fixed_bytes = 0;
  int64_t bytes_per_position = 0;     // device activations per computed position
  int64_t kv_bytes_per_position = 0;  // device KV cache per canvas position (jobs with a cache)
};

// What the Decoder keeps per sampled position besides the head's rows (out row, HeadRow, sample,
// proposal, confidence, its canvas entry in the merged batch, the merged step's copy of its sample).
inline constexpr int64_t kSamplerBytesPerPosition = 72;

// A HeadFn over a LogitsFn (the full path: each forward fills one [n_out, n_vocab] buffer of the
// function's own, and sample() reads it, parallel over `pool` when not null). Same results as the
// LogitsFn in generate().
HeadFn head_fn_from_logits(LogitsFn logits_fn, int64_t n_vocab, ThreadPool* pool);
// Its HeadMemory: a whole [n_vocab] f32 row per out row.
inline HeadMemory logits_head_memory(int64_t n_vocab) {
  return HeadMemory{n_vocab * static_cast<int64_t>(sizeof(float)) + kSamplerBytesPerPosition, 0};
}

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
  int block = 0;                              // the block being decoded (0 without block decoding)
  int n_blocks = 1;
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
  // After each forward that succeeded (the head function's call, `ms` its wall time), before its step samples.
  std::function<void(const ForwardBatch& batch, double ms)> on_forward;
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
  int forwards = 0;                // calls of logits_fn
  int cache_refreshes = 0;         // of which full passes that refreshed the KV cache
  int64_t positions_computed = 0;  // Σ over forwards of the positions computed in every row (ForwardBatch::n_computed)
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

// Runs the diffusion steps over prompts[i] + mask × new tokens and returns the canvases.
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
//
// Block decoding (Fast-dLLM, spec §6), on when block_length > 0, cache != none, or threshold / factor > 0.
// With P the padded prompt width and G = n_seq − P new tokens, block b covers [P + b·BL, min(P + (b+1)·BL,
// n_seq)) with BL = block_length (0: BL = G), the same positions in every row; blocks are decoded left to
// right, and a step's candidates are only the current block's masked positions (masks elsewhere, e.g.
// in a prompt, are never decoded).
//   fixed steps (threshold and factor off): with n_blocks = ⌈G / BL⌉ (steps >= n_blocks), block b gets
//     steps / n_blocks steps, plus one for the first steps mod n_blocks blocks. Inside a block of S steps
//     the reference schedule runs on the block: times linspace(1, eps, S + 1), k = transfer_count(batch-
//     average masked count of the block, t_i, s_i, i = S − 1), each row commits its min(k, own) most
//     confident block positions (all its own on the block's last step); origin, alg_temp and
//     unmask_policy work as above, on the block.
//   threshold / factor: confidence = probability of each position's token (maskgit_plus, whatever alg
//     is); per step each row commits its block positions with confidence >= threshold, or (factor) its n
//     most confident with n the largest such that (n + 1)(1 − c_n) < factor, at least one (the most
//     confident; ties → lowest position; alg_temp is not used); unmask_policy, when set, gets that n as k.
//     A row whose block has no mask waits; the block ends when no row has a mask in it (at most its
//     length in steps).
//   cache: the first forward of each block is kRefresh (a full pass that stores K/V: exact, and it is
//     also that step's forward); later forwards of the block are kUse over [block_begin − 1, n_seq)
//     (prefix) or [block_begin − 1, block_end) (dual); position block_begin − 1 is included because
//     position j is sampled from row j − 1. A step that runs no forward (k = 0) moves the refresh to the
//     block's next step. committed: as dual, but the block's forwards f = 1, 2, … with f % refresh_every != 0
//     compute only ForwardBatch::window_positions (CacheMode::kCommitted's rule, each row its own list,
//     window_row_begin, unless the rows' lists are the same; the whole window when that is all of it).
//     logits_fn must supply the cache (ForwardBatch::cache is null), or ignore the op and window and compute
//     every position (then the result is exact).
// Step numbers (hooks, RNG streams, history) count across blocks; n_steps is params.steps with fixed
// steps and G (an upper bound) with threshold / factor.
// Errors: invalid params/prompts, logits_fn errors, non-finite logits, an invalid unmask_policy answer,
// tokens_hook writing an out-of-range id, and cancellation by on_step (StatusCode::kCancelled:
// is_cancelled() in core/status.h is true).
Result<GenerateOutput> generate(const LogitsFn& logits_fn, int64_t n_vocab,
                                const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                const GenerateHooks& hooks = {});
// generate() over a HeadFn (e.g. Engine's chunked lm_head): the same results as over the LogitsFn
// that materialises the same logits.
Result<GenerateOutput> generate(const HeadFn& head_fn, int64_t n_vocab,
                                const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params,
                                const GenerateHooks& hooks = {});

// The prefix of `generated` before the first token in stop_ids (all of it if none occurs).
// Instruct: stop at <|dlm_pad|> (and <|im_end|>); Base: <|endoftext|>. The caller picks the ids.
std::vector<int32_t> truncate_at_stop(const std::vector<int32_t>& generated, const std::vector<int32_t>& stop_ids);

}  // namespace dc
