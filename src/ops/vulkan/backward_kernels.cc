// The training kernels' front-ends: shape checks against the buffers, then the recorded dispatches
// (backward_kernels.h).
#include "ops/vulkan/backward_kernels.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/vulkan/kernel_checks.h"

namespace dc::vk {

using namespace detail;  // NOLINT: kernel_checks.h, the front-ends' shared helpers

namespace {

// A 64 × 64 tile of c [m, cols] per workgroup (shaders/matmul_backward.comp).
Status tiled_product(Sequence& seq, const char* op, int32_t wtype, int32_t mode, const Buffer& a, const Buffer& b,
                     const Buffer* scales, const Buffer* mins, Buffer& c, int64_t m, int64_t k, int64_t cols, int64_t group_size,
                     bool accumulate) {
  Dispatch d{"matmul_backward", {wtype, mode}, {&a, &b, scales, mins, &c},
             {u32(m), u32(k), u32(cols), u32(group_size), accumulate ? 1u : 0u}, u32((cols + 63) / 64), u32((m + 63) / 64)};
  if (d.groups_x > kMaxGroups || d.groups_y > kMaxGroups) return invalid_argument(std::string(op) + ": more than 65535 tiles of 64");
  return seq.record(d);
}

}  // namespace

Status matmul_nt_backward(Sequence& seq, const Buffer& x, int64_t n, const DeviceMatrix& w, const Buffer& dy, Buffer* dx,
                          Buffer* dw, Buffer* dbias, bool accumulate_dx, bool accumulate_dw) {
  const char* op = "vulkan matmul_nt_backward";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  if (w.data.empty()) return invalid_argument(std::string(op) + ": the weight matrix is not uploaded");
  const int64_t out = w.rows, in = w.cols;
  DC_RETURN_IF_ERROR(need(dy, n * out * 4, op, "dy [n, rows]"));
  if (dx != nullptr) {
    DC_RETURN_IF_ERROR(need(*dx, n * in * 4, op, "dx [n, cols]"));
    DC_RETURN_IF_ERROR(tiled_product(seq, op, weight_type(w), 0, dy, w.data, w.scales.empty() ? nullptr : &w.scales,
                                     w.mins.empty() ? nullptr : &w.mins, *dx, n, out, in, w.group_size, accumulate_dx));
  }
  if (dw != nullptr) {
    if (w.quant != WeightQuant::kNone) return invalid_argument(std::string(op) + ": a quantized weight has no gradient");
    DC_RETURN_IF_ERROR(need(x, n * in * 4, op, "x [n, cols]"));
    DC_RETURN_IF_ERROR(need(*dw, out * in * 4, op, "dw [rows, cols]"));
    DC_RETURN_IF_ERROR(tiled_product(seq, op, /*f32*/ 0, 1, dy, x, nullptr, nullptr, *dw, out, n, in, 0, accumulate_dw));
  }
  if (dbias == nullptr) return Status();
  DC_RETURN_IF_ERROR(need(*dbias, out * 4, op, "dbias [rows]"));
  return seq.record({"column_sum", {}, {&dy, dbias}, {u32(n), u32(out), accumulate_dw ? 1u : 0u}, u32((out + 255) / 256)});
}

Status rms_norm_backward(Sequence& seq, const Buffer& x, const Buffer& w, const Buffer& dy, int64_t n, int64_t d, float eps,
                         Buffer* dx, Buffer* dw, Buffer& rstd) {
  const char* op = "vulkan rms_norm_backward";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(d, op, "d"));
  DC_RETURN_IF_ERROR(need(x, n * d * 4, op, "x [n, d]"));
  DC_RETURN_IF_ERROR(need(w, d * 4, op, "w [d]"));
  DC_RETURN_IF_ERROR(need(dy, n * d * 4, op, "dy [n, d]"));
  DC_RETURN_IF_ERROR(need(rstd, n * 4, op, "rstd [n]"));
  if (dx != nullptr) DC_RETURN_IF_ERROR(need(*dx, n * d * 4, op, "dx [n, d]"));
  if (dw != nullptr) DC_RETURN_IF_ERROR(need(*dw, d * 4, op, "dw [d]"));
  const std::vector<uint32_t> push{u32(n), u32(d), push_float(eps)};
  if (dx != nullptr || dw != nullptr) {
    Dispatch rows{"rms_norm_backward", {0, dx != nullptr ? 1 : 0}, {&x, &w, &dy, dx, nullptr, &rstd}, push};
    row_groups(n, rows);
    DC_RETURN_IF_ERROR(seq.record(rows));
  }
  if (dw == nullptr) return Status();
  return seq.record({"rms_norm_backward", {1, 0}, {&x, &w, &dy, nullptr, dw, &rstd}, push, u32((d + 127) / 128)});
}

Status swiglu_backward(Sequence& seq, const Buffer& gate, const Buffer& up, const Buffer& dout, int64_t count, Buffer& dgate,
                       Buffer& dup) {
  const char* op = "vulkan swiglu_backward";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  DC_RETURN_IF_ERROR(need(gate, count * 4, op, "gate"));
  DC_RETURN_IF_ERROR(need(up, count * 4, op, "up"));
  DC_RETURN_IF_ERROR(need(dout, count * 4, op, "dout"));
  DC_RETURN_IF_ERROR(need(dgate, count * 4, op, "dgate"));
  DC_RETURN_IF_ERROR(need(dup, count * 4, op, "dup"));
  return seq.record({"swiglu_backward", {}, {&gate, &up, &dout, &dgate, &dup}, {u32(count)}, stride_groups(count, 256)});
}

Status embedding_backward(Sequence& seq, const Buffer& ids, int64_t n, const Buffer& dy, int64_t cols, Buffer& dtable) {
  const char* op = "vulkan embedding_backward";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(cols, op, "cols"));
  DC_RETURN_IF_ERROR(need(ids, n * 4, op, "ids [n]"));
  DC_RETURN_IF_ERROR(need(dy, n * cols * 4, op, "dy [n, cols]"));
  DC_RETURN_IF_ERROR(need(dtable, cols * 4, op, "dtable [rows, cols]"));
  return seq.record({"embedding_backward", {}, {&ids, &dy, &dtable}, {u32(n), u32(cols)}, stride_groups(cols, 256)});
}

Status attention_backward(Sequence& seq, const AttentionDims& s, const Buffer& q, const Buffer& k, const Buffer& v,
                          const Buffer* valid, const Buffer& out, const Buffer& dout, Buffer& dq, Buffer& dk, Buffer& dv,
                          Buffer& stats) {
  const char* op = "vulkan attention_backward";
  DC_RETURN_IF_ERROR(positive(s.n_batch, op, "n_batch"));
  DC_RETURN_IF_ERROR(positive(s.n_seq, op, "n_seq"));
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv)
    return invalid_argument(std::string(op) + ": n_head must be a positive multiple of n_head_kv");
  DC_RETURN_IF_ERROR(check_attention_head_dim(s.head_dim, seq.device().max_shared_bytes));
  const int64_t B = s.n_batch, L = s.n_seq, D = s.head_dim, q_bytes = B * L * s.n_head * D * 4, kv_bytes = B * L * s.n_head_kv * D * 4;
  DC_RETURN_IF_ERROR(need(q, q_bytes, op, "q [B, L, n_head, head_dim]"));
  DC_RETURN_IF_ERROR(need(k, kv_bytes, op, "k [B, L, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(v, kv_bytes, op, "v [B, L, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(out, q_bytes, op, "out [B, L, n_head, head_dim]"));
  DC_RETURN_IF_ERROR(need(dout, q_bytes, op, "dout [B, L, n_head, head_dim]"));
  DC_RETURN_IF_ERROR(need(dq, q_bytes, op, "dq [B, L, n_head, head_dim]"));
  DC_RETURN_IF_ERROR(need(dk, kv_bytes, op, "dk [B, L, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(dv, kv_bytes, op, "dv [B, L, n_head_kv, head_dim]"));
  DC_RETURN_IF_ERROR(need(stats, B * L * s.n_head * 3 * 4, op, "stats [B, L, n_head, 3]"));
  if (valid) DC_RETURN_IF_ERROR(need(*valid, (B * L + 3) / 4 * 4, op, "valid [B, L] bytes"));
  const std::vector<uint32_t> push{u32(B), u32(L), u32(s.n_head), u32(s.n_head_kv), valid ? 1u : 0u,
                                   push_float(1.0f / std::sqrt(static_cast<float>(D)))};
  const int32_t d32 = static_cast<int32_t>(D);
  DC_RETURN_IF_ERROR(seq.record({"attention_backward", {d32, 0}, {&q, &k, &v, valid, &out, &dout, &stats, &dq}, push,
                                 stride_groups(B * L * s.n_head, 64)}));
  return seq.record({"attention_backward", {d32, 1}, {&q, &k, &v, valid, &dv, &dout, &stats, &dk}, push,
                     stride_groups(B * L * s.n_head_kv, 64)});
}

Status cross_entropy(Sequence& seq, const Buffer& logits, const Buffer& targets, const Buffer& weights, int64_t n, int64_t n_vocab,
                     Buffer* dlogits, Buffer* ce, Buffer& wce) {
  const char* op = "vulkan cross_entropy";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(positive(n_vocab, op, "n_vocab"));
  DC_RETURN_IF_ERROR(positive(n * n_vocab, op, "n · n_vocab"));
  DC_RETURN_IF_ERROR(need(logits, n * n_vocab * 4, op, "logits [n, n_vocab]"));
  DC_RETURN_IF_ERROR(need(targets, n * 4, op, "targets [n]"));
  DC_RETURN_IF_ERROR(need(weights, n * 4, op, "weights [n]"));
  DC_RETURN_IF_ERROR(need(wce, n * 4, op, "wce [n]"));
  if (ce != nullptr) DC_RETURN_IF_ERROR(need(*ce, n * 4, op, "ce [n]"));
  if (dlogits != nullptr) DC_RETURN_IF_ERROR(need(*dlogits, n * n_vocab * 4, op, "dlogits [n, n_vocab]"));
  Dispatch d{"cross_entropy", {dlogits != nullptr ? 1 : 0, ce != nullptr ? 1 : 0}, {&logits, &targets, &weights, dlogits, ce, &wce},
             {u32(n), u32(n_vocab)}};
  row_groups(n, d);
  return seq.record(d);
}

namespace {
constexpr int64_t kReduceChunk = 64 * 1024;  // values per workgroup of reduce.comp's first pass
}  // namespace

int64_t reduce_partials(int64_t count) { return std::max<int64_t>(1, (count + kReduceChunk - 1) / kReduceChunk); }

Status reduce_sum(Sequence& seq, const Buffer& x, int64_t offset, int64_t count, bool squares, Buffer& partials, Buffer& out,
                  int64_t out_index) {
  const char* op = "vulkan reduce_sum";
  DC_RETURN_IF_ERROR(positive(count, op, "count"));
  if (offset < 0 || out_index < 0) return invalid_argument(std::string(op) + ": offset and out_index must be >= 0");
  DC_RETURN_IF_ERROR(need(x, (offset + count) * 4, op, "x [offset + count]"));
  DC_RETURN_IF_ERROR(need(out, (out_index + 1) * 4, op, "out [out_index + 1]"));
  const int64_t parts = reduce_partials(count);
  if (parts > kMaxGroups) return invalid_argument(std::string(op) + ": more than 65535 chunks of 64 Ki values");
  const uint32_t at = u32(out_index);
  if (parts == 1) return seq.record({"reduce", {squares ? 1 : 0}, {&x, &out}, {u32(count), u32(count), u32(offset), at}, 1});
  DC_RETURN_IF_ERROR(need(partials, parts * 4, op, "partials [reduce_partials(count)]"));
  DC_RETURN_IF_ERROR(seq.record({"reduce", {squares ? 1 : 0}, {&x, &partials}, {u32(count), u32(kReduceChunk), u32(offset), 0u},
                                 u32(parts)}));
  return seq.record({"reduce", {0}, {&partials, &out}, {u32(parts), u32(parts), 0u, at}, 1});
}

Status adamw_update(Sequence& seq, const AdamWScalars& s, Buffer& p, const Buffer& g, Buffer& m, Buffer& v, int64_t n,
                    const Buffer* sumsq, float max_norm) {
  const char* op = "vulkan adamw_update";
  DC_RETURN_IF_ERROR(positive(n, op, "n"));
  DC_RETURN_IF_ERROR(need(p, n * 4, op, "p [n]"));
  DC_RETURN_IF_ERROR(need(g, n * 4, op, "g [n]"));
  DC_RETURN_IF_ERROR(need(m, n * 4, op, "m [n]"));
  DC_RETURN_IF_ERROR(need(v, n * 4, op, "v [n]"));
  if (sumsq != nullptr) DC_RETURN_IF_ERROR(need(*sumsq, 4, op, "sumsq [1]"));
  return seq.record({"adamw", {}, {&p, &g, &m, &v, sumsq},
                     {u32(n), sumsq != nullptr ? 1u : 0u, push_float(max_norm), push_float(s.decay), push_float(s.b1), push_float(s.b2),
                      push_float(s.one_b1), push_float(s.one_b2), push_float(s.step_size), push_float(s.bc2_sqrt), push_float(s.eps),
                      push_float(s.grad_scale)},
                     stride_groups(n, 256)});
}

}  // namespace dc::vk
