// The kernels' front-ends: shape checks against the buffers, then one recorded dispatch (kernels.h).
#include "ops/vulkan/kernels.h"
#include "ops/vulkan/kernel_checks.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace dc::vk {

using namespace detail;  // NOLINT: kernel_checks.h, the front-ends' shared helpers

namespace {

// A GEMM or an attention of fewer workgroups than this is split (over k, or over keys) into more, to fill
// a GPU (1024 measured the same on an H100).
constexpr int64_t kSplitTargetGroups = 512;

// {parts, units per part} for splitting `units` (k-slices, key tiles) of a grid of `groups` workgroups: up to
// kSplitTargetGroups workgroups in all, at most max_parts parts, rebalanced so that no part is empty.
std::pair<int64_t, int64_t> split_parts(int64_t groups, int64_t units, int64_t max_parts) {
  const int64_t parts =
      groups < kSplitTargetGroups ? std::max<int64_t>(1, std::min((kSplitTargetGroups + groups - 1) / groups, max_parts)) : 1;
  const int64_t per = (units + parts - 1) / parts;
  return {(units + per - 1) / per, per};
}

}  // namespace

Result<DeviceMatrix> upload_matrix(Runtime& rt, const HostMatrix& m, std::string_view name) {
  const std::string what(name);
  DeviceMatrix d;
  d.dtype = m.dtype, d.quant = m.quant, d.rows = m.rows, d.cols = m.cols, d.group_size = m.group_size;
  if (m.rows <= 0 || m.cols <= 0 || !m.data) return invalid_argument(what + ": a matrix needs rows, cols > 0 and data");
  int64_t data_bytes = 0, table_bytes = 0;
  switch (m.quant) {
    case WeightQuant::kNone:
      if (!is_float_dtype(m.dtype)) return invalid_argument(what + ": a dense matrix is F32, F16 or BF16, not " + dtype_name(m.dtype));
      data_bytes = m.rows * m.cols * static_cast<int64_t>(dtype_size(m.dtype));
      break;
    case WeightQuant::kQ8:
      if (m.dtype != DType::kI8 || !m.scales) return invalid_argument(what + ": q8 needs I8 codes and f32 row scales");
      data_bytes = m.rows * m.cols, table_bytes = m.rows * 4;
      break;
    case WeightQuant::kQ4:
      if (m.dtype != DType::kU8 || !m.scales || !m.mins || m.group_size < 2 || m.group_size % 2 || m.cols % m.group_size)
        return invalid_argument(what + ": q4 needs U8 codes, f16 scales and mins, and an even group_size dividing cols");
      data_bytes = m.rows * m.cols / 2, table_bytes = m.rows * (m.cols / m.group_size) * 2;
      break;
    case WeightQuant::kGguf:
      return unimplemented(what + ": ggml block weights (a quantized GGUF) have no device kernels");
  }
  // Shaders read whole 32-bit words: round the buffers up (the padding is never used).
  const auto words = [](int64_t bytes) { return (bytes + 3) / 4 * 4; };
  DC_ASSIGN_OR_RETURN(d.data, rt.alloc(words(data_bytes), what));
  std::vector<Upload> pending;
  DC_ASSIGN_OR_RETURN(Upload up, rt.upload_async(d.data, m.data, data_bytes));
  pending.push_back(std::move(up));
  if (table_bytes > 0) {
    DC_ASSIGN_OR_RETURN(d.scales, rt.alloc(words(table_bytes), what + " scales"));
    DC_ASSIGN_OR_RETURN(Upload us, rt.upload_async(d.scales, m.scales, table_bytes));
    pending.push_back(std::move(us));
  }
  if (m.quant == WeightQuant::kQ4) {
    DC_ASSIGN_OR_RETURN(d.mins, rt.alloc(words(table_bytes), what + " mins"));
    DC_ASSIGN_OR_RETURN(Upload um, rt.upload_async(d.mins, m.mins, table_bytes));
    pending.push_back(std::move(um));
  }
  for (Upload& u : pending) DC_RETURN_IF_ERROR(u.wait());
  return d;
}

bool uses_matrix_units(const DeviceInfo& device, int64_t n, const DeviceMatrix& w) {
  const int32_t wtype = weight_type(w);
  return device.matrix_units && (wtype == 1 || wtype == 2) && w.cols % 64 == 0 && n > 8;
}

Status matmul_nt(Sequence& seq, const Buffer& x, int64_t n, const DeviceMatrix& w, const Buffer* bias, Buffer& y, bool matrix_units,
                 Buffer* split_scratch, const Epilogue& epilogue) {
  const char* op = "vulkan matmul_nt";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  if (w.data.empty()) return invalid_argument(std::string(op) + ": the weight matrix is not uploaded");
  DC_RETURN_IF_ERROR(need(x, n * w.cols * 4, op, "x [n, cols]"));
  DC_RETURN_IF_ERROR(need(y, n * w.rows * 4, op, "y [n, rows]"));
  if (bias) DC_RETURN_IF_ERROR(need(*bias, w.rows * 4, op, "bias [rows]"));
  const Buffer* aux = nullptr;
  if (epilogue.kind != Epilogue::kStore) {
    if (epilogue.aux == nullptr) return invalid_argument(std::string(op) + ": the epilogue's aux operand is missing");
    DC_RETURN_IF_ERROR(need(*epilogue.aux, n * w.rows * 4, op, "the epilogue's aux [n, rows]"));
    aux = epilogue.aux;
  }
  const uint32_t mode = epilogue.kind;
  Dispatch d;
  if (matrix_units && uses_matrix_units(seq.device(), n, w)) {  // 64 × 128 tiles of y
    const int64_t tiles = (w.rows + 127) / 128 * ((n + 63) / 64), slices = w.cols / 64;
    // Split the slices: >= 2 per workgroup (one loading while one multiplies), the partial sums within the
    // scratch.
    const bool scratch = split_scratch != nullptr && !split_scratch->empty();
    const auto [splits, per_group] =
        split_parts(tiles, slices, scratch ? std::min(slices / 2, split_scratch->bytes() / (n * w.rows * 4)) : 1);
    d.shader = "matmul_coop";
    d.spec = {weight_type(w)};
    d.buffers = {&x, &w.data, bias, &y, splits > 1 ? split_scratch : nullptr, aux};
    d.push = {u32(n), u32(w.rows), u32(w.cols), bias ? 1u : 0u, u32(per_group), mode};
    d.groups_x = u32((w.rows + 127) / 128), d.groups_y = u32((n + 63) / 64), d.groups_z = u32(splits);
    if (d.groups_y > kMaxGroups || d.groups_x > kMaxGroups) return invalid_argument(std::string(op) + ": more than 65535 tiles");
    DC_RETURN_IF_ERROR(seq.record(d));
    if (splits == 1) return Status();
    Dispatch r;
    r.shader = "split_reduce";
    r.buffers = {split_scratch, bias, &y, aux};
    r.push = {u32(n * w.rows), u32(w.rows), u32(splits), bias ? 1u : 0u, mode};
    r.groups_x = stride_groups(n * w.rows, 256);
    return seq.record(r);
  }
  const bool few_rows = n <= 8;
  d.shader = few_rows ? "matvec" : "matmul";
  d.spec = {weight_type(w)};
  d.buffers = {&x, &w.data, w.scales.empty() ? nullptr : &w.scales, w.mins.empty() ? nullptr : &w.mins, bias, &y, aux};
  d.push = {u32(n), u32(w.rows), u32(w.cols), u32(w.group_size), bias ? 1u : 0u, mode};
  if (few_rows) {
    row_groups(w.rows, d);
  } else {
    d.groups_x = u32((w.rows + 63) / 64), d.groups_y = u32((n + 63) / 64);
    if (d.groups_y > kMaxGroups || d.groups_x > kMaxGroups) return invalid_argument(std::string(op) + ": more than 65535 tiles of 64 rows");
  }
  return seq.record(d);
}

namespace {

// gather_rows over a matrix of weight type `wtype` (weights.glsl) whose buffers are data / scales / mins.
Status gather(Sequence& seq, int32_t wtype, const Buffer& data, const Buffer* scales, const Buffer* mins, int64_t cols,
              int64_t group_size, const Buffer& ids, int64_t n, Buffer& out) {
  const char* op = "vulkan gather_rows";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(n * cols, op, "n · cols"));
  if (data.empty()) return invalid_argument(std::string(op) + ": the matrix is not on the device");
  DC_RETURN_IF_ERROR(need(ids, n * 4, op, "ids [n]"));
  DC_RETURN_IF_ERROR(need(out, n * cols * 4, op, "out [n, cols]"));
  return seq.record({"gather_rows", {wtype}, {&ids, &data, scales, mins, &out}, {u32(n), u32(cols), u32(group_size)},
                     stride_groups(n * cols, 256)});
}

}  // namespace

Status gather_rows(Sequence& seq, const DeviceMatrix& w, const Buffer& ids, int64_t n, Buffer& out) {
  return gather(seq, weight_type(w), w.data, w.scales.empty() ? nullptr : &w.scales, w.mins.empty() ? nullptr : &w.mins,
                w.cols, w.group_size, ids, n, out);
}

Status gather_rows(Sequence& seq, const Buffer& x, int64_t cols, const Buffer& ids, int64_t n, Buffer& out) {
  return gather(seq, /*f32*/ 0, x, nullptr, nullptr, cols, 0, ids, n, out);
}

Status rms_norm(Sequence& seq, const Buffer& x, const Buffer& w, int64_t n, int64_t d, float eps, Buffer& y) {
  const char* op = "vulkan rms_norm";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(d, op, "d"));
  DC_RETURN_IF_ERROR(need(x, n * d * 4, op, "x [n, d]"));
  DC_RETURN_IF_ERROR(need(w, d * 4, op, "w [d]"));
  DC_RETURN_IF_ERROR(need(y, n * d * 4, op, "y [n, d]"));
  Dispatch dispatch{"rms_norm", {}, {&x, &w, &y}, {u32(n), u32(d), push_float(eps)}};
  row_groups(n, dispatch);
  return seq.record(dispatch);
}

Result<Buffer> rope_inv_freq(Runtime& rt, int64_t head_dim, double theta) {
  if (head_dim <= 0 || head_dim % 2) return invalid_argument("vulkan rope: head_dim " + std::to_string(head_dim) + " must be even and positive");
  if (!(theta > 0)) return invalid_argument("vulkan rope: rope_theta must be positive");
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return rt.make_buffer(inv_freq, "RoPE inv_freq");
}

Status rope_tables(Sequence& seq, const Buffer& positions, int64_t n, int64_t head_dim, const Buffer& inv_freq,
                   Buffer& cos, Buffer& sin) {
  const char* op = "vulkan rope_tables";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  if (head_dim <= 0 || head_dim % 2) return invalid_argument(std::string(op) + ": head_dim must be even and positive");
  const int64_t half = head_dim / 2;
  DC_RETURN_IF_ERROR(need(positions, n * 4, op, "positions [n]"));
  DC_RETURN_IF_ERROR(need(inv_freq, half * 4, op, "inv_freq [head_dim/2]"));
  DC_RETURN_IF_ERROR(need(cos, n * half * 4, op, "cos [n, head_dim/2]"));
  DC_RETURN_IF_ERROR(need(sin, n * half * 4, op, "sin [n, head_dim/2]"));
  return seq.record({"rope_tables", {}, {&positions, &inv_freq, &cos, &sin}, {u32(n), u32(half)}, stride_groups(n * half, 256)});
}

Status rope_apply(Sequence& seq, Buffer& x, int64_t n, int64_t n_heads, int64_t head_dim, const Buffer& cos,
                  const Buffer& sin, bool inverse) {
  const char* op = "vulkan rope_apply";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(n_heads, op, "n_heads"));
  if (head_dim <= 0 || head_dim % 2) return invalid_argument(std::string(op) + ": head_dim must be even and positive");
  const int64_t half = head_dim / 2;
  DC_RETURN_IF_ERROR(need(x, n * n_heads * head_dim * 4, op, "x [n, n_heads, head_dim]"));
  DC_RETURN_IF_ERROR(need(cos, n * half * 4, op, "cos [n, head_dim/2]"));
  DC_RETURN_IF_ERROR(need(sin, n * half * 4, op, "sin [n, head_dim/2]"));
  return seq.record({"rope", {inverse ? 1 : 0}, {&x, &cos, &sin}, {u32(n), u32(n_heads), u32(half)}, stride_groups(n * n_heads * half, 256)});
}

Status rope_kv(Sequence& seq, Buffer& q, Buffer& k, int64_t n, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
               const Buffer& cos, const Buffer& sin, const KvWindow* window, const Buffer* v, Buffer* cache_k, Buffer* cache_v,
               const RopeKvOffsets& at) {
  const char* op = "vulkan rope_kv";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(n_head, op, "n_head"));
  DC_RETURN_IF_ERROR(positive(n_head_kv, op, "n_head_kv"));
  if (head_dim <= 0 || head_dim % 2) return invalid_argument(std::string(op) + ": head_dim must be even and positive");
  const int64_t half = head_dim / 2, kv_cols = n_head_kv * head_dim;
  DC_RETURN_IF_ERROR(positive(n * (n_head + 2 * n_head_kv) * head_dim, op, "n · (n_head + 2 n_head_kv) · head_dim"));
  DC_RETURN_IF_ERROR(offsets({at.q, at.k, at.v, at.cos, at.sin}, op));
  DC_RETURN_IF_ERROR(need(q, (at.q + n * n_head * head_dim) * 4, op, "q [n, n_head, head_dim]"));
  DC_RETURN_IF_ERROR(need(k, (at.k + n * kv_cols) * 4, op, "k [n, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(cos, (at.cos + n * half) * 4, op, "cos [n, head_dim/2]"));
  DC_RETURN_IF_ERROR(need(sin, (at.sin + n * half) * 4, op, "sin [n, head_dim/2]"));
  KvWindow win;
  if (window != nullptr) {
    win = *window;
    if (v == nullptr || cache_k == nullptr || cache_v == nullptr) return invalid_argument(std::string(op) + ": a window needs v and both caches");
    if (win.n_batch <= 0 || win.window_len <= 0 || win.n_batch * win.window_len != n || win.window_begin < 0 ||
        win.window_begin + win.window_len > win.n_seq)
      return invalid_argument(std::string(op) + ": window [" + std::to_string(win.window_begin) + ", " +
                              std::to_string(win.window_begin + win.window_len) + ") of " + std::to_string(win.n_batch) +
                              " rows does not fit the sequence of " + std::to_string(win.n_seq) + " or the " + std::to_string(n) + " rows");
    DC_RETURN_IF_ERROR(need(*v, (at.v + n * kv_cols) * 4, op, "v [n, n_head_kv · head_dim]"));
    DC_RETURN_IF_ERROR(need(*cache_k, win.n_batch * win.n_seq * kv_cols * 4, op, "cache_k [B, L, cols]"));
    DC_RETURN_IF_ERROR(need(*cache_v, win.n_batch * win.n_seq * kv_cols * 4, op, "cache_v [B, L, cols]"));
  }
  const bool store = window != nullptr;
  return seq.record({"rope_kv", {}, {&q, &k, store ? v : nullptr, &cos, &sin, store ? cache_k : nullptr, store ? cache_v : nullptr},
                     {u32(n), u32(n_head), u32(n_head_kv), u32(half), store ? 1u : 0u, u32(win.window_len), u32(win.n_seq),
                      u32(win.window_begin), u32(at.q), u32(at.k), u32(store ? at.v : 0), u32(at.cos), u32(at.sin)},
                     stride_groups(n * ((n_head + n_head_kv) * half + (store ? kv_cols : 0)), 256)});
}

Status swiglu(Sequence& seq, const Buffer& gate, const Buffer& up, int64_t count, Buffer& out) {
  const char* op = "vulkan swiglu";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  DC_RETURN_IF_ERROR(need(gate, count * 4, op, "gate"));
  DC_RETURN_IF_ERROR(need(up, count * 4, op, "up"));
  DC_RETURN_IF_ERROR(need(out, count * 4, op, "out"));
  return seq.record({"elementwise", {0}, {&gate, &up, &out}, {u32(count)}, stride_groups(count, 256)});
}

Status add_inplace(Sequence& seq, Buffer& y, const Buffer& x, int64_t count) {
  const char* op = "vulkan add_inplace";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  DC_RETURN_IF_ERROR(need(y, count * 4, op, "y"));
  DC_RETURN_IF_ERROR(need(x, count * 4, op, "x"));
  return seq.record({"elementwise", {1}, {&y, &x, &y}, {u32(count)}, stride_groups(count, 256)});
}

Status scale(Sequence& seq, const Buffer& x, int64_t count, float s, Buffer& y) {
  const char* op = "vulkan scale";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  DC_RETURN_IF_ERROR(need(x, count * 4, op, "x"));
  DC_RETURN_IF_ERROR(need(y, count * 4, op, "y"));
  return seq.record({"elementwise", {2}, {&x, &x, &y}, {u32(count), push_float(s)}, stride_groups(count, 256)});
}

Status dropout(Sequence& seq, const Buffer& x, int64_t n, int64_t d, uint64_t seed, uint64_t threshold, float keep_scale,
               Buffer& y) {
  const char* op = "vulkan dropout";
  DC_RETURN_IF_ERROR(positive(n * d, op, "n · d"));
  DC_RETURN_IF_ERROR(need(x, n * d * 4, op, "x"));
  DC_RETURN_IF_ERROR(need(y, n * d * 4, op, "y"));
  const auto lo = [](uint64_t v) { return static_cast<uint32_t>(v); };
  const auto hi = [](uint64_t v) { return static_cast<uint32_t>(v >> 32); };
  return seq.record({"dropout", {}, {&x, &y},
                     {u32(n * d), u32(d), lo(seed), hi(seed), lo(threshold), hi(threshold), push_float(keep_scale)},
                     stride_groups(n * d, 256)});
}

Status copy(Sequence& seq, const Buffer& x, int64_t x_offset, int64_t count, Buffer& y, int64_t y_offset) {
  const char* op = "vulkan copy";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  if (x_offset < 0 || y_offset < 0) return invalid_argument(std::string(op) + ": offsets must be >= 0");
  DC_RETURN_IF_ERROR(need(x, (x_offset + count) * 4, op, "x [x_offset + count]"));
  DC_RETURN_IF_ERROR(need(y, (y_offset + count) * 4, op, "y [y_offset + count]"));
  if (&x == &y) return invalid_argument(std::string(op) + ": y is x");
  return seq.record({"fill", {0}, {&x, &y}, {u32(count), u32(x_offset), u32(y_offset)}, stride_groups(count, 256)});
}

Status zero_fill(Sequence& seq, Buffer& y, int64_t count) {
  const char* op = "vulkan zero_fill";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  DC_RETURN_IF_ERROR(need(y, count * 4, op, "y"));
  return seq.record({"fill", {1}, {&y, &y}, {u32(count), 0u, 0u}, stride_groups(count, 256)});
}

Status kv_store(Sequence& seq, const Buffer& src, int64_t n_batch, int64_t n_seq, int64_t window_begin, int64_t window_len,
                int64_t cols, Buffer& cache) {
  const char* op = "vulkan kv_store";
  DC_RETURN_IF_ERROR(positive(n_batch, op, "n_batch"));
  DC_RETURN_IF_ERROR(positive(window_len, op, "window_len"));
  DC_RETURN_IF_ERROR(positive(cols, op, "cols"));
  if (window_begin < 0 || window_begin + window_len > n_seq)
    return invalid_argument(std::string(op) + ": window [" + std::to_string(window_begin) + ", " + std::to_string(window_begin + window_len) +
                            ") is outside the sequence of " + std::to_string(n_seq));
  const int64_t count = n_batch * window_len * cols;
  DC_RETURN_IF_ERROR(positive(count, op, "n_batch · window_len · cols"));
  DC_RETURN_IF_ERROR(need(src, count * 4, op, "src [B, W, cols]"));
  DC_RETURN_IF_ERROR(need(cache, n_batch * n_seq * cols * 4, op, "cache [B, L, cols]"));
  return seq.record({"kv_store", {}, {&src, &cache}, {u32(count), u32(window_len), u32(n_seq), u32(cols), u32(window_begin)},
                     stride_groups(count, 256)});
}

int64_t attention_shared_bytes(int64_t head_dim, AttentionTile tile) {
  return ((tile.rows + tile.keys) * (head_dim + 1) + tile.keys * head_dim + tile.rows * tile.keys) * 4;
}

AttentionTile attention_tile(int64_t head_dim, int64_t max_shared_bytes) {
  const AttentionTile wide;
  return attention_shared_bytes(head_dim, wide) <= max_shared_bytes ? wide : AttentionTile{8, 8};
}

Status check_attention_head_dim(int64_t head_dim, int64_t max_shared_bytes) {
  if (head_dim < 16 || head_dim > 128 || head_dim % 2)
    return invalid_argument("vulkan attention: head_dim " + std::to_string(head_dim) + " is not an even size in [16, 128]; use --device cpu");
  const int64_t bytes = attention_shared_bytes(head_dim, attention_tile(head_dim, max_shared_bytes));
  if (bytes > max_shared_bytes)
    return invalid_argument("vulkan attention: head_dim " + std::to_string(head_dim) + " needs " + std::to_string(bytes) +
                            " bytes of shared memory per workgroup, more than this device's " + std::to_string(max_shared_bytes) +
                            " (maxComputeSharedMemorySize); use --device cpu");
  return Status();
}

Status attention(Sequence& seq, const AttentionDims& s, int64_t window_begin, int64_t window_len, const Buffer& q,
                 const Buffer& k, const Buffer& v, const Buffer* valid, Buffer& out, Buffer* split_scratch,
                 const AttentionOffsets& at) {
  const char* op = "vulkan attention";
  DC_RETURN_IF_ERROR(positive(s.n_batch, op, "n_batch"));
  DC_RETURN_IF_ERROR(positive(s.n_seq, op, "n_seq"));
  DC_RETURN_IF_ERROR(positive(window_len, op, "window_len"));
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv)
    return invalid_argument(std::string(op) + ": n_head must be a positive multiple of n_head_kv");
  DC_RETURN_IF_ERROR(check_attention_head_dim(s.head_dim, seq.device().max_shared_bytes));
  if (window_begin < 0 || window_begin + window_len > s.n_seq)
    return invalid_argument(std::string(op) + ": window [" + std::to_string(window_begin) + ", " + std::to_string(window_begin + window_len) +
                            ") is outside the sequence of " + std::to_string(s.n_seq));
  if (s.n_head > kMaxGroups || s.n_batch > kMaxGroups) return invalid_argument(std::string(op) + ": more than 65535 heads or rows");
  const int64_t B = s.n_batch, D = s.head_dim;
  DC_RETURN_IF_ERROR(offsets({at.q, at.k, at.v, at.valid, at.out}, op));
  DC_RETURN_IF_ERROR(need(q, (at.q + B * window_len * s.n_head * D) * 4, op, "q [B, W, n_head, head_dim]"));
  DC_RETURN_IF_ERROR(need(k, (at.k + B * s.n_seq * s.n_head_kv * D) * 4, op, "k [B, L, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(v, (at.v + B * s.n_seq * s.n_head_kv * D) * 4, op, "v [B, L, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(out, (at.out + B * window_len * s.n_head * D) * 4, op, "out [B, W, n_head, head_dim]"));
  if (valid) DC_RETURN_IF_ERROR(need(*valid, (at.valid + B * s.n_seq + 3) / 4 * 4, op, "valid [B, L] bytes"));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const AttentionTile tile = attention_tile(D, seq.device().max_shared_bytes);
  // Split the keys (a window of few queries against a long cache): >= 1 key tile per split, the partial
  // rows within the scratch.
  const int64_t blocks = (window_len + tile.rows - 1) / tile.rows * s.n_head * B, key_tiles = (s.n_seq + tile.keys - 1) / tile.keys;
  const int64_t part_row_bytes = B * window_len * s.n_head * (D + 2) * 4;
  const bool scratch = split_scratch != nullptr && !split_scratch->empty();
  const auto [splits, tiles_per_split] =
      split_parts(blocks, key_tiles, scratch ? std::min({key_tiles, split_scratch->bytes() / part_row_bytes, kMaxGroups / B}) : 1);
  const int64_t keys_per_split = tiles_per_split * tile.keys;
  Dispatch d{"attention", {static_cast<int32_t>(D), static_cast<int32_t>(tile.rows), static_cast<int32_t>(tile.keys), static_cast<int32_t>(8 * tile.rows)},
             {&q, &k, &v, valid, &out, splits > 1 ? split_scratch : nullptr},
             {u32(window_len), u32(s.n_seq), u32(s.n_head), u32(s.n_head_kv), u32(window_begin), valid ? 1u : 0u, push_float(scale),
              u32(splits), u32(keys_per_split), u32(at.q), u32(at.k), u32(at.v), u32(valid ? at.valid : 0), u32(at.out)},
             u32((window_len + tile.rows - 1) / tile.rows), u32(s.n_head), u32(B * splits)};
  DC_RETURN_IF_ERROR(seq.record(d));
  if (splits == 1) return Status();
  const int64_t rows = B * window_len * s.n_head;
  return seq.record({"attention_combine", {}, {split_scratch, &out}, {u32(rows), u32(D), u32(splits), u32(at.out)}, stride_groups(rows * D, 256)});
}

namespace {

// Invocations per row of sample_rows.comp. On a GPU the most it takes (a power of two; every device takes 128).
// On a CPU device (lavapipe runs a workgroup on one thread) 256, which measured 3-4x faster there than 1024,
// or more where the row needs it: llvmpipe ends an invocation's loops after 65535 iterations counted over all
// of them (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS), silently, with wrong sums behind (a V = 152064 row with
// top-k and top-p needs ~87k at 256). The shader runs at most 109 + 2·bit_width(V) passes over the row (its
// header), each ceil(V / threads) iterations, a log2(threads)-step reduction and one step of a search.
Result<int32_t> sample_threads(const DeviceInfo& device, int64_t n_vocab) {
  int64_t threads = device.type == "CPU" ? 256 : 1024;
  while (threads > 128 && threads > device.max_workgroup_x) threads /= 2;
  if (device.type != "CPU") return static_cast<int32_t>(threads);
  constexpr int64_t kLoopLimit = 65535, kSlack = 512;  // the searches' own steps and a margin
  const int64_t passes = 109 + 2 * std::bit_width(static_cast<uint64_t>(n_vocab));
  for (; threads <= device.max_workgroup_x; threads *= 2) {
    const int64_t per_pass = (n_vocab + threads - 1) / threads + std::bit_width(static_cast<uint64_t>(threads));
    if (passes * per_pass + kSlack <= kLoopLimit) return static_cast<int32_t>(threads);
  }
  return invalid_argument("vulkan sample_rows: n_vocab " + std::to_string(n_vocab) + " is too long a row to sample on the CPU device " +
                          device.name + " (llvmpipe ends a shader's loops after 65535 iterations in all); use a GPU or --device cpu");
}

}  // namespace

Status sample_rows(Sequence& seq, const Buffer& logits, int64_t n, int64_t n_vocab, const RowFilter& filter,
                   const Buffer& uniforms, Buffer& ids, Buffer& conf, const SampleRowsOffsets& at) {
  const char* op = "vulkan sample_rows";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(n_vocab, op, "n_vocab"));
  if (!(filter.temperature >= 0)) return invalid_argument(std::string(op) + ": temperature must be >= 0 (0: greedy)");
  if (!(filter.top_p > 0)) return invalid_argument(std::string(op) + ": top_p must be in (0, 1] (1: off)");
  DC_RETURN_IF_ERROR(offsets({at.logits, at.uniforms, at.ids, at.conf}, op));
  DC_RETURN_IF_ERROR(need(logits, (at.logits + n * n_vocab) * 4, op, "logits [n, n_vocab]"));
  DC_RETURN_IF_ERROR(need(uniforms, (at.uniforms + n) * 4, op, "uniforms [n]"));
  DC_RETURN_IF_ERROR(need(ids, (at.ids + n) * 4, op, "ids [n]"));
  DC_RETURN_IF_ERROR(need(conf, (at.conf + n * 3) * 4, op, "conf [n, 3]"));
  const int64_t top_k = filter.top_k > 0 && filter.top_k < n_vocab ? filter.top_k : 0;  // sampler/filters.h's "on"
  const Result<int32_t> threads = sample_threads(seq.device(), n_vocab);
  if (!threads.ok()) return threads.status();
  Dispatch d{"sample_rows", {*threads}, {&logits, &uniforms, &ids, &conf},
             {u32(n), u32(n_vocab), push_float(filter.temperature), push_float(std::min(filter.top_p, 1.0f)), u32(top_k),
              u32(at.logits), u32(at.uniforms), u32(at.ids), u32(at.conf)}};
  row_groups(n, d);
  return seq.record(d);
}

}  // namespace dc::vk
