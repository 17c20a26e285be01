// The Dream forward pass (spec §2): embeddings, n_layer pre-norm blocks of bidirectional GQA attention
// with RoPE and q/k/v biases plus a SwiGLU MLP, final RMSNorm, lm_head on the requested rows only;
// optionally over a window of positions with the other positions' K/V from a KvCache (spec §6).
#include "model/transformer.h"

#include <algorithm>
#include <new>
#include <string>
#include <vector>

#include "core/profiler.h"
#include "core/workspace.h"
#include "model/activations.h"
#include "model/kv_cache.h"
#include "model/lora_project.h"
#include "ops/attention.h"
#include "ops/attention_window.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace dc {

Result<std::unique_ptr<Model>> Model::load(const std::string& dir) {
  DC_ASSIGN_OR_RETURN(Checkpoint opened, Checkpoint::open(dir));
  auto checkpoint = std::make_shared<const Checkpoint>(std::move(opened));
  ModelConfig config = checkpoint->config();
  auto vectors = std::make_shared<VectorStore>(config);  // the f32 norm weights and biases
  DC_ASSIGN_OR_RETURN(ModelWeights weights, bind_weights(*checkpoint, config, *vectors));
  return std::unique_ptr<Model>(new Model(std::move(checkpoint), std::move(vectors), std::move(config), std::move(weights)));
}

std::unique_ptr<Model> Model::from_weights(ModelConfig config, ModelWeights weights,
                                           std::shared_ptr<const void> storage) {
  return std::unique_ptr<Model>(new Model(nullptr, std::move(storage), std::move(config), std::move(weights)));
}

Status Model::check_batch(const ForwardBatch& b) const {
  if (b.n_batch <= 0 || b.n_seq <= 0) return invalid_argument("forward: empty batch");
  if (b.tokens == nullptr) return invalid_argument("forward: no tokens");
  if (b.n_out < 0 || (b.n_out > 0 && b.out_rows == nullptr)) return invalid_argument("forward: bad out_rows");
  const int64_t n = b.n_batch * b.n_seq;
  for (int64_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= config_.n_vocab)
      return invalid_argument("token id " + std::to_string(b.tokens[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(config_.n_vocab) + ")");
    if (b.positions != nullptr && b.positions[i] < 0)
      return invalid_argument("position id " + std::to_string(b.positions[i]) + " at index " + std::to_string(i) +
                              " is negative");
  }
  const int64_t wb = b.window_begin, we = b.window_stop();
  if (wb < 0 || we > b.n_seq || wb >= we)
    return invalid_argument("forward: window [" + std::to_string(wb) + ", " + std::to_string(we) +
                            ") is empty or outside the sequence of " + std::to_string(b.n_seq) + " positions");
  if (b.window_row_begin != nullptr && b.window_positions == nullptr)
    return invalid_argument("forward: window_row_begin needs window_positions");
  if (b.window_positions != nullptr) {
    if (b.cache_op != CacheOp::kUse || b.n_window_positions <= 0)
      return invalid_argument("forward: window_positions need cache_op kUse and at least one position");
    const int64_t* offsets = b.window_row_begin;
    if (offsets != nullptr && (offsets[0] != 0 || offsets[b.n_batch] != b.n_window_positions))
      return invalid_argument("forward: window_row_begin runs from " + std::to_string(offsets[0]) + " to " +
                              std::to_string(offsets[b.n_batch]) + "; the row offsets must rise from 0 to "
                              "n_window_positions (" + std::to_string(b.n_window_positions) + ")");
    for (int64_t r = 0; offsets != nullptr && r < b.n_batch; ++r)
      if (offsets[r + 1] < offsets[r])
        return invalid_argument("forward: window_row_begin[" + std::to_string(r + 1) + "] = " +
                                std::to_string(offsets[r + 1]) + " is below the row before's " + std::to_string(offsets[r]) +
                                "; the row offsets must rise from 0 to n_window_positions");
    // Each row's list (one for every row without offsets) ascends inside the window.
    for (int64_t r = 0; r < (offsets != nullptr ? b.n_batch : 1); ++r) {
      const int64_t first = offsets != nullptr ? offsets[r] : 0;
      for (int64_t i = first; i < first + b.row_width(r); ++i) {
        const int64_t at = b.window_positions[i];
        if (at < wb || at >= we || (i > first && at <= b.window_positions[i - 1]))
          return invalid_argument("forward: window_positions[" + std::to_string(i) + "] = " + std::to_string(at) +
                                  " does not ascend inside the window [" + std::to_string(wb) + ", " + std::to_string(we) + ")");
      }
    }
  }
  const bool full = wb == 0 && we == b.n_seq && b.window_positions == nullptr;
  if (!full && b.cache_op != CacheOp::kUse)
    return invalid_argument("forward: a window smaller than the sequence needs cache_op kUse");
  if (b.cache_op != CacheOp::kNone && b.cache == nullptr)
    return invalid_argument("forward: cache_op needs a cache (ForwardBatch::cache is null)");
  if (b.cache_op == CacheOp::kUse) {
    const int64_t kv_dim = config_.n_head_kv * config_.head_dim;
    if (!b.cache->filled() || !b.cache->matches(config_.n_layer, b.n_batch, b.n_seq, kv_dim))
      return invalid_argument("forward: cache_op kUse needs a cache filled by a kRefresh forward of the same "
                              "batch shape (" + std::to_string(b.n_batch) + " × " + std::to_string(b.n_seq) + ")");
  }
  for (int64_t r = 0; r < b.n_out; ++r) {
    if (b.out_rows[r] < 0 || b.out_rows[r] >= n)
      return invalid_argument("out_rows[" + std::to_string(r) + "] = " + std::to_string(b.out_rows[r]) +
                              " is outside the batch of " + std::to_string(n) + " rows");
    const int64_t i = b.out_rows[r] % b.n_seq;
    if (i < wb || i >= we)
      return invalid_argument("out_rows[" + std::to_string(r) + "] = " + std::to_string(b.out_rows[r]) +
                              " (position " + std::to_string(i) + ") is outside the window [" + std::to_string(wb) +
                              ", " + std::to_string(we) + ")");
    const int64_t row = b.out_rows[r] / b.n_seq;
    if (b.window_positions != nullptr &&
        !std::binary_search(b.row_positions(row), b.row_positions(row) + b.row_width(row), i))
      return invalid_argument("out_rows[" + std::to_string(r) + "] = " + std::to_string(b.out_rows[r]) +
                              " (position " + std::to_string(i) + ") is not one of the window_positions of its row");
  }
  return Status();
}

Status Model::forward(const Context& ctx, const ForwardBatch& b, float* logits, const ForwardObserver* observer,
                      Activations* train) const {
  return forward_checked(ctx, {&b, 1}, nullptr, logits, observer, train);
}

Status Model::forward_hidden(const Context& ctx, const ForwardBatch& b, float* hidden, Activations* train) const {
  return forward_checked(ctx, {&b, 1}, hidden, nullptr, nullptr, train);
}

Status Model::forward_hidden_parts(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden) const {
  return forward_checked(ctx, parts, hidden, nullptr, nullptr, nullptr);
}

Status Model::record_hidden(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden) const {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "Model::record_hidden: a device context");
  DC_ASSIGN_OR_RETURN(const std::vector<ForwardBatch> checked, checked_parts(ctx, parts));
  return forward_body(ctx, checked, hidden, nullptr, nullptr);
}

Status Model::check_forward(const Context& ctx, std::span<const ForwardBatch> parts) const {
  return checked_parts(ctx, parts).status();
}

Status Model::check_forward(const Context& ctx, const ForwardBatch& batch) const {
  ForwardBatch b = batch;
  if (b.lora == nullptr) b.lora = lora_;  // set_lora's adapters
  DC_RETURN_IF_ERROR(check_batch(b));
  if (b.cache_op == CacheOp::kUse && b.cache->backend() != ctx.backend) {
    const auto where = [](const DeviceBackend* d) { return d != nullptr ? d->name() : std::string("the CPU"); };
    return invalid_argument("forward: the KV cache was filled on " + where(b.cache->backend()) +
                            " and this forward runs on " + where(ctx.backend) +
                            "; a cache is read only on the device that filled it (refresh it there first)");
  }
  if (b.lora != nullptr && static_cast<int64_t>(b.lora->layers.size()) != config_.n_layer)
    return invalid_argument("forward: the LoRA adapters have " + std::to_string(b.lora->layers.size()) +
                            " layers, the model " + std::to_string(config_.n_layer));
  if (b.window_positions != nullptr && ctx.device != Device::kCpu)
    return invalid_argument("forward: scattered window positions (cache \"committed\") run on the CPU only; on " +
                            ctx.backend->name() + " use cache \"dual\" or --device cpu");
  return Status();
}

Result<std::vector<ForwardBatch>> Model::checked_parts(const Context& ctx, std::span<const ForwardBatch> batches) const {
  if (batches.empty()) return invalid_argument("forward: no parts");
  std::vector<ForwardBatch> parts(batches.begin(), batches.end());
  for (size_t p = 0; p < parts.size(); ++p) {
    ForwardBatch& b = parts[p];
    if (b.lora == nullptr) b.lora = lora_;  // set_lora's adapters
    Status s = check_forward(ctx, b);
    if (!s.ok() && parts.size() > 1) s = s.with_context("part " + std::to_string(p));
    DC_RETURN_IF_ERROR(s);
    if (b.lora != parts[0].lora) return invalid_argument("forward: the parts name different LoRA adapters");
    if (b.cache_op != CacheOp::kNone)
      for (size_t o = 0; o < p; ++o)
        if (parts[o].cache_op != CacheOp::kNone && parts[o].cache == b.cache)
          return invalid_argument("forward: parts " + std::to_string(o) + " and " + std::to_string(p) + " share a KV cache");
  }
  return parts;
}

Status Model::forward_checked(const Context& ctx, std::span<const ForwardBatch> batches, float* hidden, float* logits,
                              const ForwardObserver* observer, Activations* train) const {
  const ProfileScope profile(ctx, "forward");
  DC_ASSIGN_OR_RETURN(const std::vector<ForwardBatch> parts, checked_parts(ctx, batches));
  int64_t n_out = 0, n_computed = 0, n_rows = 0;
  for (const ForwardBatch& b : parts) n_out += b.n_out, n_computed += b.n_computed(), n_rows += b.n_batch;
  if (ctx.device != Device::kCpu) return forward_on_device(ctx, parts, hidden, logits, observer, train);
  // The activations and the kernels' scratch live in ctx.workspace (an Engine generation's, a Trainer's),
  // grown to the largest forward so far and reused: fresh buffers each forward cost a zero fill and page
  // faults (~5% of a 0.5B step). Without one, in this call's own (freed on return).
  Workspace own_workspace;
  Context with_ws = ctx;
  if (with_ws.workspace == nullptr) with_ws.workspace = &own_workspace;
  try {
    if (hidden == nullptr && n_out > 0) hidden = with_ws.workspace->floats("forward.hidden", n_out * config_.n_embd);
    DC_RETURN_IF_ERROR(forward_body(with_ws, parts, hidden, observer, train));
    // Training mode: one product (the loss wants every row; chunks would stream the weight again each).
    if (logits != nullptr) lm_head(with_ws, hidden, n_out, logits, train != nullptr ? std::max<int64_t>(n_out, 1) : kHeadChunkRows);
    return Status();
  } catch (const std::bad_alloc&) {  // the workspace, the kernels' scratch (rethrown by the pool) or the cache
    for (const ForwardBatch& b : parts)
      if (b.cache != nullptr && b.cache_op == CacheOp::kRefresh) b.cache->set_filled(false);
    return resource_exhausted("forward: out of memory for the activations of " + std::to_string(n_computed) +
                              " positions (" + std::to_string(n_rows) + " rows); use fewer rows or a shorter canvas");
  }
}

void Model::lm_head(const Context& ctx, const float* hidden, int64_t n, float* logits, int64_t chunk_rows) const {
  DC_CHECK(chunk_rows > 0, "Model::lm_head: chunk_rows must be positive");
  const int64_t E = config_.n_embd, V = config_.n_vocab;
  for (int64_t r = 0; r < n; r += chunk_rows)
    matmul_nt(ctx, hidden + r * E, std::min(chunk_rows, n - r), weights_.output, nullptr, logits + r * V);
}

Status Model::forward_on_device(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden, float* logits,
                                const ForwardObserver* observer, Activations* train) const {
  if (observer != nullptr) return invalid_argument("forward: the debug observer runs on the CPU only (--device cpu)");
  const int64_t E = config_.n_embd, V = config_.n_vocab;
  int64_t n_out = 0;
  for (const ForwardBatch& b : parts) n_out += b.n_out;
  const std::unique_lock<std::mutex> lock = ctx.backend->lock();
  if (parts[0].lora != nullptr) DC_RETURN_IF_ERROR(lora_to_device(ctx, *parts[0].lora));
  DC_RETURN_IF_ERROR(ctx.backend->begin());
  // The final-normed rows (in the caller's device memory for forward_hidden) and their logits stay on the
  // device; only the logits come back.
  float* rows = logits != nullptr ? device_floats(ctx, "forward.hidden", n_out * E) : hidden;  // [n_out, E]
  float* out = logits != nullptr ? device_floats(ctx, "forward.logits", n_out * V) : nullptr;  // [n_out, V]
  DC_RETURN_IF_ERROR(device_status(ctx));
  Status s = forward_body(ctx, parts, rows, nullptr, train);
  if (s.ok() && logits != nullptr && n_out > 0) {
    lm_head(ctx, rows, n_out, out, n_out);  // one product: no offsets into device rows
    ctx.backend->copy_out("forward.logits", as_device(out), logits, n_out * V * static_cast<int64_t>(sizeof(float)));
  }
  if (s.ok()) s = ctx.backend->finish();
  if (!s.ok())  // recorded, not run
    for (const ForwardBatch& b : parts)
      if (b.cache != nullptr && b.cache_op == CacheOp::kRefresh) b.cache->set_filled(false);
  return s;
}

Status Model::to_device(const Context& ctx) const {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "Model::to_device: a device context");
  DC_RETURN_IF_ERROR(ctx.backend->check_head_dim(config_.head_dim));
  const int64_t bytes = device_weight_bytes();  // checked before any upload
  if (bytes > ctx.backend->memory_bytes())
    return resource_exhausted("the weights need " + std::to_string(bytes >> 20) + " MiB on " + ctx.backend->name() + ", which has " +
                              std::to_string(ctx.backend->memory_bytes() >> 20) + " MiB: use a quantized checkpoint (convert --quantize) or --device cpu");
  Status status;
  visit_tensors(config_, weights_, [&](const std::string& name, const std::vector<int64_t>&, const WeightView* m,
                                       const VectorView* v) {
    if (!status.ok()) return;
    status = m != nullptr ? ctx.backend->add_matrix(*m, name) : ctx.backend->add_vector(v->data(), static_cast<int64_t>(v->size()), name);
  });
  return status;
}

int64_t Model::device_weight_bytes() const {
  int64_t bytes = 0;
  visit_tensors(config_, weights_, [&](const std::string&, const std::vector<int64_t>&, const WeightView* m,
                                       const VectorView* v) {
    if (m != nullptr) bytes += m->rows * m->cols * static_cast<int64_t>(dtype_size(m->dtype)) / (m->quant == WeightQuant::kQ4 ? 2 : 1);
    if (v != nullptr) bytes += static_cast<int64_t>(v->size() * sizeof(float));
  });
  return bytes;
}

Status Model::lora_to_device(const Context& ctx, const LoraWeights& lora) const {
  DC_CHECK(ctx.device != Device::kCpu && ctx.backend != nullptr, "Model::lora_to_device: a device context");
  if (static_cast<int64_t>(lora.layers.size()) != config_.n_layer)
    return invalid_argument("lora_to_device: the adapters have " + std::to_string(lora.layers.size()) + " layers, the model " +
                            std::to_string(config_.n_layer));
  const LayerWeights& l0 = weights_.layers.front();  // every layer's projections are shaped alike
  const WeightView* base[kLoraTargets] = {&l0.wq, &l0.wk, &l0.wv, &l0.wo, &l0.w_gate, &l0.w_up, &l0.w_down};
  for (int64_t il = 0; il < config_.n_layer; ++il)
    for (int t = 0; t < kLoraTargets; ++t) {
      const LoraMatrix& m = lora.layers[il][t];
      if (m.empty()) continue;
      const std::string name = lora_module_path(il, t);
      DC_RETURN_IF_ERROR(ctx.backend->add_matrix(WeightView{DType::kF32, m.a, m.r, base[t]->cols}, name + ".lora_A"));
      DC_RETURN_IF_ERROR(ctx.backend->add_matrix(WeightView{DType::kF32, m.b, base[t]->rows, m.r}, name + ".lora_B"));
    }
  return Status();
}

int64_t Model::forward_bytes_per_position() const {
  const ModelConfig& c = config_;
  const int64_t floats = 2 * c.n_embd + 2 * c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim + 2 * c.n_ff + c.head_dim;
  return floats * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(int32_t)) + 1;  // + token, valid
}

namespace {

// Each part's computed positions' tokens and RoPE positions, row-major (row b's row_width(b) from row_first(b)),
// after the previous parts' (tokens, positions [Σ n_computed]), and the out rows' indices into those rows
// (out_index [Σ n_out]: the rows whose logits are wanted). check_batch has checked every part.
void gather_inputs(std::span<const ForwardBatch> parts, int32_t* tokens, int32_t* positions, int32_t* out_index) {
  for (int64_t p = 0, row0 = 0, out0 = 0; p < static_cast<int64_t>(parts.size()); ++p) {
    const ForwardBatch& part = parts[p];
    const int64_t L = part.n_seq, wb = part.window_begin;
    for (int64_t r = 0; r < part.n_batch; ++r) {
      const int64_t* at = part.row_positions(r);  // null: the window's every position
      const int64_t first = row0 + part.row_first(r);
      for (int64_t i = 0; i < part.row_width(r); ++i) {
        const int64_t pos = at != nullptr ? at[i] : wb + i, flat = r * L + pos;
        tokens[first + i] = part.tokens[flat];
        positions[first + i] = part.positions != nullptr ? part.positions[flat] : static_cast<int32_t>(pos);
      }
    }
    for (int64_t r = 0; r < part.n_out; ++r) {
      const int64_t row = part.out_rows[r] / L, i = part.out_rows[r] % L;  // a computed position
      const int64_t* at = part.row_positions(row);
      const int64_t in_row = at != nullptr ? std::lower_bound(at, at + part.row_width(row), i) - at : i - wb;
      out_index[out0 + r] = static_cast<int32_t>(row0 + part.row_first(row) + in_row);
    }
    row0 += part.n_computed(), out0 += part.n_out;
  }
}

// On a device, points each part's padding mask (ForwardBatch::valid, [n_batch, n_seq] bytes) into one device
// copy of them all, one after another (parts without a mask keep none); the CPU reads them where they are.
void stage_masks(const Context& ctx, std::vector<ForwardBatch>& parts) {
  if (ctx.device == Device::kCpu) return;
  std::vector<uint8_t> masks;  // [Σ n_batch · n_seq of the parts with one]
  for (const ForwardBatch& part : parts)
    if (part.valid != nullptr) masks.insert(masks.end(), part.valid, part.valid + part.n_batch * part.n_seq);
  if (masks.empty()) return;
  const uint8_t* staged = device_copy(ctx, "forward.valid", masks.data(), static_cast<int64_t>(masks.size()));
  for (int64_t at = 0; ForwardBatch& part : parts)
    if (part.valid != nullptr) {
      part.valid = staged != nullptr ? staged + at : nullptr;  // a device operand: its handle plus a byte offset
      at += part.n_batch * part.n_seq;
    }
}

}  // namespace

Status Model::forward_body(const Context& ctx, std::span<const ForwardBatch> parts, float* hidden,
                           const ForwardObserver* observer, Activations* train) const {
  const ForwardBatch& b = parts[0];  // training mode: the only part
  if (train != nullptr && (parts.size() > 1 || b.cache_op != CacheOp::kNone || b.window_begin != 0 ||
                           b.window_stop() != b.n_seq))
    return invalid_argument("forward: training mode needs the whole sequence and no KV cache");
  const ModelConfig& c = config_;
  const int64_t E = c.n_embd, D = c.head_dim, F = c.n_ff;
  const int64_t q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // One part refreshing its cache computes K/V straight into it (same [n_batch, L, kv_dim] layout); with
  // several parts every part's K/V are stacked rows, stored into its cache by layer_forward.
  const bool kv_in_cache = parts.size() == 1 && b.cache_op == CacheOp::kRefresh;
  int64_t T = 0, n_out = 0;  // T: computed positions of all parts
  for (const ForwardBatch& part : parts) {
    T += part.n_computed(), n_out += part.n_out;
    if (part.cache_op == CacheOp::kRefresh)
      DC_RETURN_IF_ERROR(part.cache->reset(ctx, c.n_layer, part.n_batch, part.n_seq, kv_dim));
  }
  auto observe = [&](const std::string& name, const float* data, std::vector<int64_t> shape) {
    if (observer != nullptr) (*observer)(name, data, shape);
  };

  std::vector<int32_t> tokens(T), positions(T);  // [T]
  std::vector<int32_t> out_index(n_out);         // [n_out]
  gather_inputs(parts, tokens.data(), positions.data(), out_index.data());
  std::vector<float> cos(T * D / 2), sin(T * D / 2);  // [T, D/2]
  rope_tables(positions.data(), T, D, c.rope_theta, cos.data(), sin.data());
  if (train != nullptr) {  // training mode: the forward writes the activations backward needs into *train
    DC_RETURN_IF_ERROR(train->resize(ctx, c.n_layer, T, E, q_dim, kv_dim, F, b.n_out, b.lora));
    train->n_batch = b.n_batch, train->n_seq = b.n_seq;
    train->tokens = tokens, train->cos = cos, train->sin = sin;
    if (b.valid != nullptr) train->valid.assign(b.valid, b.valid + T);
    else train->valid.clear();
    train->out_rows.assign(b.out_rows, b.out_rows + b.n_out);
  }

  // Buffers in ctx.workspace (set by forward()) on the CPU, in device memory on a device.
  const int64_t Ts = train ? 0 : T;  // training mode: these live in *train instead
  float* h = device_floats(ctx, "forward.h", T * E);                              // [T, E] residual stream
  float* a = device_floats(ctx, "forward.a", T * E);                              // [T, E] normed input
  float* q = device_floats(ctx, "forward.q", Ts * q_dim);                         // [T, H*D]
  float* attn = device_floats(ctx, "forward.attn", Ts * q_dim);                   // [T, H*D]
  float* k_own = device_floats(ctx, "forward.k", kv_in_cache ? 0 : Ts * kv_dim);  // [T, Hkv*D]
  float* v_own = device_floats(ctx, "forward.v", kv_in_cache ? 0 : Ts * kv_dim);  // [T, Hkv*D]
  float* gate = device_floats(ctx, "forward.gate", Ts * F);                       // [T, F]
  float* up = device_floats(ctx, "forward.up", Ts * F);                           // [T, F]
  // The host inputs where the ops read them (the host's own on the CPU).
  const int32_t* ids = device_copy(ctx, "forward.tokens", tokens.data(), T);
  const float* cos_at = device_copy(ctx, "forward.cos", cos.data(), T * D / 2);
  const float* sin_at = device_copy(ctx, "forward.sin", sin.data(), T * D / 2);
  const int32_t* out_index_at = device_copy(ctx, "forward.out_rows", out_index.data(), n_out);
  std::vector<ForwardBatch> batches(parts.begin(), parts.end());  // the padding masks where attention reads them
  stage_masks(ctx, batches);
  DC_RETURN_IF_ERROR(device_status(ctx));

  embedding(ctx, weights_.tok_embd, ids, T, h);
  observe("embd", h, {T, E});
  for (int64_t il = 0; il < c.n_layer; ++il) {
    // With recomputation only the layer's input is kept; the rest goes to the one scratch layer.
    LayerActivations* act = train ? (train->recompute ? &train->scratch : &train->layers[il]) : nullptr;
    if (train) copy_floats(ctx, h, T * E, train->layers[il].x);
    LayerPass pass{batches, T, cos_at, sin_at, h, a, observer};
    pass.a1 = act ? act->a1 : a;
    pass.q = act ? act->q : q;
    pass.k = kv_in_cache ? b.cache->k(il) : act ? act->k : k_own;
    pass.v = kv_in_cache ? b.cache->v(il) : act ? act->v : v_own;
    pass.kv_in_cache = kv_in_cache;
    pass.attn = act ? act->attn : attn;
    pass.h_mid = act ? act->h_mid : nullptr;
    pass.a2 = act ? act->a2 : a;
    pass.gate = act ? act->gate : gate;
    pass.up = act ? act->up : up;
    pass.act = act ? act->act : gate;  // silu(gate)·up (in place on gate when not training)
    pass.lora_u = act ? &act->lora_u : nullptr;
    layer_forward(ctx, il, pass);
  }
  for (const ForwardBatch& part : parts)
    if (part.cache_op == CacheOp::kRefresh) part.cache->set_filled(true);
  if (n_out == 0) return Status();
  float* rows = hidden;  // [n_out, E]: only the rows whose logits are wanted
  gather_rows(ctx, h, E, out_index_at, n_out, rows);
  if (train) copy_floats(ctx, rows, n_out * E, train->final_x);
  rms_norm(ctx, rows, weights_.output_norm.data(), n_out, E, eps, rows);
  if (train) copy_floats(ctx, rows, n_out * E, train->final_norm);
  observe("output_norm", rows, {n_out, E});
  return Status();
}

void Model::rows_attention(const Context& ctx, int64_t il, const ForwardBatch& part, float* q, float* k, const float* v,
                           const float* cos, const float* sin, float* attn) const {
  const ModelConfig& c = config_;
  const int64_t L = part.n_seq, D = c.head_dim, q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  const AttentionShape row_shape{1, L, c.n_head, c.n_head_kv, D};
  for (int64_t b = 0; b < part.n_batch; ++b) {
    const int64_t W = part.row_width(b), first = part.row_first(b);
    if (W == 0) continue;
    float* cache_k = part.cache->k(il) + b * L * kv_dim;  // [L, Hkv*D] row b's
    float* cache_v = part.cache->v(il) + b * L * kv_dim;
    const uint8_t* valid = part.valid != nullptr ? part.valid + b * L : nullptr;
    rope_kv(ctx, row_shape, part.window_begin, W, q + first * q_dim, k + first * kv_dim, v + first * kv_dim,
            cos + first * D / 2, sin + first * D / 2, cache_k, cache_v, part.row_positions(b));
    attention_window(ctx, row_shape, part.window_begin, W, q + first * q_dim, cache_k, cache_v, valid,
                     attn + first * q_dim, part.row_positions(b));
  }
}

void Model::layer_forward(const Context& ctx, int64_t il, const LayerPass& p) const {
  const ModelConfig& c = config_;
  const ForwardBatch& b = p.parts[0];  // the parts' LoRA adapters are the same (forward_checked)
  const int64_t T = p.T;
  const int64_t E = c.n_embd, D = c.head_dim, F = c.n_ff, q_dim = c.n_head * D, kv_dim = c.n_head_kv * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const LayerWeights& l = weights_.layers[il];
  std::string prefix;  // (appended: GCC 12 warns falsely of an overlapping copy in "L" + std::to_string(il))
  if (p.observer != nullptr) prefix.append("L").append(std::to_string(il)).append(".");
  auto observe = [&](const char* name, const float* data, std::vector<int64_t> shape_of) {
    if (p.observer != nullptr) (*p.observer)(prefix + name, data, shape_of);
  };
  rms_norm(ctx, p.h, l.attn_norm.data(), T, E, eps, p.a1);
  observe("attn_norm", p.a1, {T, E});
  // Each projection with its LoRA adapter, if any (u saved for the backward in training mode).
  auto project = [&](const float* x, const WeightView& w, const float* bias, float* y, int t) {
    lora_project(ctx, x, T, w, bias, y, LoraSite{b.lora, il, t}, p.lora_u != nullptr,
                 p.lora_u != nullptr ? (*p.lora_u)[t] : nullptr);
  };
  project(p.a1, l.wq, l.bq.data(), p.q, kLoraQ);
  project(p.a1, l.wk, l.bk.data(), p.k, kLoraK);
  project(p.a1, l.wv, l.bv.data(), p.v, kLoraV);
  // Per part (its rows from row0): RoPE, and with a cache the window's fresh K/V into it (kUse: replacing
  // the cached ones; one pass on a device), then its attention over its window or its cache.
  for (int64_t row0 = 0; const ForwardBatch& part : p.parts) {
    const int64_t L = part.n_seq, wb = part.window_begin, W = part.window_width();
    const AttentionShape shape{part.n_batch, L, c.n_head, c.n_head_kv, D};
    KvCache* cache = part.cache;
    const bool store = part.cache_op == CacheOp::kUse || (part.cache_op == CacheOp::kRefresh && !p.kv_in_cache);
    float* q = p.q + row0 * q_dim;     // [T_p, H*D]
    float* k = p.k + row0 * kv_dim;    // [T_p, Hkv*D]
    float* v = p.v + row0 * kv_dim;    // [T_p, Hkv*D]
    float* attn = p.attn + row0 * q_dim;
    if (part.window_row_begin != nullptr) {
      rows_attention(ctx, il, part, q, k, v, p.cos + row0 * D / 2, p.sin + row0 * D / 2, attn);
    } else {
      rope_kv(ctx, shape, wb, W, q, k, v, p.cos + row0 * D / 2, p.sin + row0 * D / 2, store ? cache->k(il) : nullptr,
              store ? cache->v(il) : nullptr, part.window_positions);
      if (W == L) {
        attention(ctx, shape, q, k, v, part.valid, attn);
      } else {
        attention_window(ctx, shape, wb, W, q, cache->k(il), cache->v(il), part.valid, attn, part.window_positions);
      }
    }
    row0 += part.n_computed();
  }
  observe("q", p.q, {T, q_dim});
  observe("k", p.k, {T, kv_dim});
  observe("v", p.v, {T, kv_dim});
  observe("attn", p.attn, {T, q_dim});
  // Without adapters or training, the residual adds and SwiGLU go into the products (one pass on a device).
  const bool fused = b.lora == nullptr && p.lora_u == nullptr;
  if (fused) {
    matmul_nt_residual(ctx, p.attn, T, l.wo, p.h, p.tmp);
  } else {
    project(p.attn, l.wo, nullptr, p.tmp, kLoraO);
    add_inplace(ctx, p.h, p.tmp, T * E);
  }
  observe("attn_residual", p.h, {T, E});
  if (p.h_mid != nullptr) copy_floats(ctx, p.h, T * E, p.h_mid);
  rms_norm(ctx, p.h, l.ffn_norm.data(), T, E, eps, p.a2);
  observe("ffn_norm", p.a2, {T, E});
  project(p.a2, l.w_gate, nullptr, p.gate, kLoraGate);
  if (fused) {
    matmul_nt_swiglu(ctx, p.a2, T, l.w_up, p.gate, p.act, p.up);
    matmul_nt_residual(ctx, p.act, T, l.w_down, p.h, p.tmp);
  } else {
    project(p.a2, l.w_up, nullptr, p.up, kLoraUp);
    swiglu(ctx, p.gate, p.up, T * F, p.act);
    project(p.act, l.w_down, nullptr, p.tmp, kLoraDown);
    add_inplace(ctx, p.h, p.tmp, T * E);
  }
  observe("out", p.h, {T, E});
}

}  // namespace dc
