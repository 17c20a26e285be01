// The Vulkan kernels of the Dream forward and the head sampler, each a compute shader (shaders/) behind
// a front-end that checks the shapes against the buffers and records one dispatch into a Sequence.
// Operands are device buffers of f32 row-major activations unless stated; shapes are those of the CPU
// ops (ops/matmul.h, ops/elementwise.h, ops/attention_window.h), which are the kernels' reference.
// Errors (kInvalidArgument) name the op and the operand; nothing runs until Sequence::run().
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/vulkan/runtime.h"
#include "types/quantization.h"

namespace dc::vk {

// A weight matrix on the device in its stored row-major layout (ops/weight.h kRowMajor): f32 / f16 /
// bf16, or q8 (int8 codes + f32 row scales) / q4 (nibbles + f16 scales and mins per group_size columns).
struct DeviceMatrix {
  DType dtype = DType::kF32;  // kI8 for q8, kU8 for q4
  WeightQuant quant = WeightQuant::kNone;
  int64_t rows = 0, cols = 0, group_size = 0;
  Buffer data, scales, mins;  // scales / mins empty unless quantized (mins: q4 only)
};

// Host pointers of a matrix to upload, as a WeightView holds them (row-major only).
struct HostMatrix {
  DType dtype = DType::kF32;
  WeightQuant quant = WeightQuant::kNone;
  int64_t rows = 0, cols = 0, group_size = 0;
  const void* data = nullptr;
  const void* scales = nullptr;
  const void* mins = nullptr;
};

// Uploads a matrix (asynchronously, waiting before it returns). Errors: a dtype / quant combination the
// CPU ops do not have, q4 with an odd group_size or one that does not divide cols, out of device memory.
Result<DeviceMatrix> upload_matrix(Runtime& rt, const HostMatrix& m, std::string_view name);

// y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias[w.rows] when bias != nullptr); overwrites y. f32 accumulation.
// n <= 8: one workgroup per output column with subgroup reductions (bandwidth-bound rows); otherwise
// 64×64 tiles through shared memory, in f32. With `matrix_units`, on a device that has them
// (DeviceInfo::matrix_units), dense f16 / bf16 weights with w.cols % 64 == 0 and n > 8 go to the matrix
// units instead (shaders/matmul_coop.comp): x rounded to f16, f32 accumulation. There, `split_scratch`
// (any size; null: none) lets a GEMM of few tiles split its columns over more workgroups, whose partial
// sums it holds until split_reduce.comp adds them in a fixed order.
//
// `epilogue` (shaders/epilogue.glsl) folds the element-wise pass that would follow into the product's store:
// kAdd: y += the product (the residual add into h; `aux` is y); kSwiglu: y = silu(aux) · the product (aux: the
// gate [n, w.rows]; y may be aux) — the same f32 arithmetic as add_inplace / swiglu after a plain matmul_nt.
struct Epilogue {
  enum Kind : uint32_t { kStore = 0, kAdd = 1, kSwiglu = 2 };
  Kind kind = kStore;
  const Buffer* aux = nullptr;  // [n, w.rows]; unused by kStore
};
Status matmul_nt(Sequence& seq, const Buffer& x, int64_t n, const DeviceMatrix& w, const Buffer* bias, Buffer& y,
                 bool matrix_units = false, Buffer* split_scratch = nullptr, const Epilogue& epilogue = {});
// True when matmul_nt(..., matrix_units = true) runs on the matrix units for these operands.
bool uses_matrix_units(const DeviceInfo& device, int64_t n, const DeviceMatrix& w);

// out[n, w.cols] = the rows ids[n] (uint32, each < w.rows: the caller checks them) of w widened to f32: the
// embedding lookup (ops/elementwise.h embedding).
Status gather_rows(Sequence& seq, const DeviceMatrix& w, const Buffer& ids, int64_t n, Buffer& out);
// The same over f32 activations x[rows, cols]: out[n, cols] = x[ids[n]] (the forward's out rows).
Status gather_rows(Sequence& seq, const Buffer& x, int64_t cols, const Buffer& ids, int64_t n, Buffer& out);

// y[n, d] = x * rsqrt(mean(x²) + eps) * w[d]; y may be x.
Status rms_norm(Sequence& seq, const Buffer& x, const Buffer& w, int64_t n, int64_t d, float eps, Buffer& y);

// inv_freq[head_dim/2] = 1 / theta^(2i / head_dim) in f32, the table of rope_tables (computed on the host
// once per model, as the CPU's rope_tables computes it).
Result<Buffer> rope_inv_freq(Runtime& rt, int64_t head_dim, double theta);
// cos / sin [n, head_dim/2] for int32 positions[n]: angles pos · inv_freq[i] in f32, cos and sin by the
// device (its own approximations: compare with a tolerance, not bit for bit).
Status rope_tables(Sequence& seq, const Buffer& positions, int64_t n, int64_t head_dim, const Buffer& inv_freq,
                   Buffer& cos, Buffer& sin);
// In place on x[n, n_heads, head_dim], rotate-half RoPE with cos / sin [n, head_dim/2]; `inverse`: the
// rotation by −θ, RoPE's backward (ops/elementwise.h rope_backward).
Status rope_apply(Sequence& seq, Buffer& x, int64_t n, int64_t n_heads, int64_t head_dim, const Buffer& cos,
                  const Buffer& sin, bool inverse = false);

// out[count] = silu(gate) * up; out may be gate or up.
Status swiglu(Sequence& seq, const Buffer& gate, const Buffer& up, int64_t count, Buffer& out);
// y[count] += x[count].
Status add_inplace(Sequence& seq, Buffer& y, const Buffer& x, int64_t count);
// y[count] = s · x[count]; y may be x.
Status scale(Sequence& seq, const Buffer& x, int64_t count, float s, Buffer& y);
// y[y_offset + i] = x[x_offset + i] for i < count (f32 words, bit for bit); y must not be x.
Status copy(Sequence& seq, const Buffer& x, int64_t x_offset, int64_t count, Buffer& y, int64_t y_offset);
// y[count] = 0.
Status zero_fill(Sequence& seq, Buffer& y, int64_t count);
// ops/dropout.h dropout_hashed over x [n, d] with its threshold and 1/(1 − p); y may be x.
Status dropout(Sequence& seq, const Buffer& x, int64_t n, int64_t d, uint64_t seed, uint64_t threshold, float keep_scale,
               Buffer& y);

// The attention kernel's tile: `rows` query rows per workgroup, `keys` keys and values per pass.
struct AttentionTile {
  int64_t rows = 16, keys = 16;
};
// Its shared memory at head_dim: rows queries, keys keys and keys values of head_dim floats and the rows × keys
// scores (q and k rows padded by one float) — 16 × 16: 13.4 KB at head_dim 64, 25.7 KB at 128; 8 × 8: 12.6 KB at 128 (a device guarantees 16 KiB).
int64_t attention_shared_bytes(int64_t head_dim, AttentionTile tile);
// The tile attention() runs with: 16 × 16 where it fits max_shared_bytes, else 8 × 8.
AttentionTile attention_tile(int64_t head_dim, int64_t max_shared_bytes);
// Ok when the attention kernel takes head_dim on a device with max_shared_bytes per workgroup
// (DeviceInfo::max_shared_bytes): head_dim even in [16, 128] and the 8 × 8 tile within the limit (always, on
// a device with the 16 KiB every device guarantees). Else kInvalidArgument naming head_dim (and the limit),
// checked when a model is uploaded.
Status check_attention_head_dim(int64_t head_dim, int64_t max_shared_bytes);

struct AttentionDims {
  int64_t n_batch = 0, n_seq = 0;                   // B, L (keys per row)
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;  // head_dim even, 16..128; n_head % n_head_kv == 0
};
// attention_window of ops/attention_window.h: out[B, W, n_head, head_dim] for the W = window_len queries
// q[B, W, n_head, head_dim] at positions [window_begin, window_begin + W) against k, v [B, L, n_head_kv,
// head_dim]; `valid` (nullptr: every pair) holds the padding mask as bytes [B, L] (buffer rounded up to
// whole 4-byte words). window_begin = 0, W = L: the full attention (ops/attention.h). `split_scratch` (null:
// none) lets a window of few queries split the keys over more workgroups, merged by attention_combine.comp.
// `at`: where each operand starts in its buffer (floats; valid: bytes), e.g. a part's rows in buffers that stack
// several parts' (Model::forward_hidden_parts on a device); the shapes are checked from there.
struct AttentionOffsets {
  int64_t q = 0, k = 0, v = 0, valid = 0, out = 0;
};
Status attention(Sequence& seq, const AttentionDims& dims, int64_t window_begin, int64_t window_len, const Buffer& q,
                 const Buffer& k, const Buffer& v, const Buffer* valid, Buffer& out, Buffer* split_scratch = nullptr,
                 const AttentionOffsets& at = {});

// cache[B, L, C] at positions [window_begin, window_begin + W) of each row = src[B, W, C] (the window's fresh
// K or V into the KV cache; ops/attention_window.h kv_store).
Status kv_store(Sequence& seq, const Buffer& src, int64_t n_batch, int64_t n_seq, int64_t window_begin, int64_t window_len,
                int64_t cols, Buffer& cache);

// The window of a step's fresh K / V in the KV cache (kv_store's operands): rows b · W + i of the step go to
// positions window_begin + i of cache row b, W = window_len.
struct KvWindow {
  int64_t n_batch = 0, n_seq = 0, window_begin = 0, window_len = 0;
};
// rope_apply on q [n, n_head, head_dim] and on k [n, n_head_kv, head_dim], and with `window` (nullptr: none)
// kv_store of the rotated k and of v [n, n_head_kv · head_dim] into cache_k / cache_v [B, L, n_head_kv ·
// head_dim] (n = B · W): one dispatch (shaders/rope_kv.comp), the arithmetic of rope_apply's. `at`: where q, k,
// v, cos and sin start in their buffers (floats; the caches are whole), as attention's AttentionOffsets.
struct RopeKvOffsets {
  int64_t q = 0, k = 0, v = 0, cos = 0, sin = 0;
};
Status rope_kv(Sequence& seq, Buffer& q, Buffer& k, int64_t n, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
               const Buffer& cos, const Buffer& sin, const KvWindow* window, const Buffer* v, Buffer* cache_k, Buffer* cache_v,
               const RopeKvOffsets& at = {});

// The filters of a sampled step (ops/head_sampler.h FilterConfig).
struct RowFilter {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]; 1: off
  int64_t top_k = 0;         // <= 0 or >= n_vocab: off
};
// The head sampler's step per row of logits[n, n_vocab] (sampler/filters.h sample_token's rules): the
// temperature, top-p then top-k, the softmax over the survivors and the token — the argmax (lowest id on
// ties) when greedy, else the categorical draw of uniforms[row] (f32 in [0, 1), the CPU's stream's draw) in
// the CPU's order — into ids[n] (uint32), and conf[n, 3] of the filtered p: the chosen token's probability,
// the top-1 − top-2 margin and Σ p·log(p + 1e-10); NaN for a row with a NaN or +inf logit or every logit −inf.
// Only the n ids and 3n confidences are written: the rows are never sorted or copied.
// Each operand may start at an offset into its buffer (elements; a part's rows of a merged step).
struct SampleRowsOffsets {
  int64_t logits = 0, uniforms = 0, ids = 0, conf = 0;
};
Status sample_rows(Sequence& seq, const Buffer& logits, int64_t n, int64_t n_vocab, const RowFilter& filter,
                   const Buffer& uniforms, Buffer& ids, Buffer& conf, const SampleRowsOffsets& at = {});

}  // namespace dc::vk
