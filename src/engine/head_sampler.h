// CpuHeadSampler: the CPU implementation of HeadSampler (ops/head_sampler.h) over a Model: the forward
// up to the final-normed hidden rows, then the lm_head in chunks of rows into one reused [chunk, n_vocab]
// block, each chunk's positions sampled from it (sampler/filters.h's sample_head_rows) before the next.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/context.h"
#include "core/workspace.h"
#include "model/transformer.h"
#include "ops/head_sampler.h"

namespace dc {

class CpuHeadSampler final : public HeadSampler {
 public:
  // `ctx` (pool, precision) computes the forward, the lm_head and the sampling; the forward's activations
  // and the chunk block live in this object's own workspace (ctx.workspace is replaced). chunk_rows > 0:
  // the rows of one lm_head product (Model::kHeadChunkRows: the same logits as Model::forward).
  CpuHeadSampler(const Model& model, const Context& ctx, int64_t chunk_rows = Model::kHeadChunkRows);

  // Model::forward_hidden over `batch` (its cache as given) into this object's hidden rows.
  Status forward(const ForwardBatch& batch) { return forward({&batch, 1}); }
  // Model::forward_hidden_parts: the parts' hidden rows one after the other (part p's after those of parts < p).
  Status forward(std::span<const ForwardBatch> parts);

  int64_t n_rows() const override { return n_rows_; }
  // Model::lm_head over hidden rows [first, first + n), in chunks of chunk_rows counted from `first`.
  Status logits(int64_t first, int64_t n, float* out) override;
  // Per chunk of chunk_rows hidden rows counted from args.rows' first hidden row (up to its last one): the
  // chunk's logits into the block, then its positions sampled from it, parallel over ctx's pool.
  Status sample(const HeadSampling& args, std::span<TokenSample> out) override { return sample_as_one_part(args, out); }
  // The same over several requests' parts in one pass: the chunks counted from the first part's first hidden
  // row up to the last part's last one, each chunk's logits computed once and each part's entries in it
  // sampled with that part's settings (the lm_head weights read once per chunk, not once per part's chunk).
  Status sample_parts(std::span<const HeadSampling> parts, std::span<TokenSample> out, std::span<Status> status) override;
  void release() override;

  // Bytes of this object's scratch now (the forward's activations and the chunk block).
  int64_t workspace_bytes() const { return workspace_.bytes(); }

  // Bytes of the chunk block at this model's vocabulary: what sample() holds besides the hidden rows.
  static int64_t chunk_bytes(const Model& model, int64_t chunk_rows = Model::kHeadChunkRows) {
    return chunk_rows * model.config().n_vocab * static_cast<int64_t>(sizeof(float));
  }

 private:
  const Model& model_;
  Context ctx_;
  int64_t chunk_rows_;
  Workspace workspace_;
  std::vector<float> hidden_;  // [n_rows_, n_embd]
  int64_t n_rows_ = 0;
};

}  // namespace dc
