// The reference (portable) kernels' names of kernels.h and backward_kernels.h: each calls the AVX2 + FMA
// variant (kernels_avx2.cc) when cpu_level() >= kAvx2, else the baseline one (core/kernel_variant.h). One load
// and compare per kernel call, against thousands of flops.
#include "ops/cpu/backward_kernels.h"
#include "ops/cpu/kernels.h"

// The two variants of kernel `name`, declared with the type of its kernels.h declaration (so a variant whose
// signature drifts does not link).
#define DC_DECLARE_VARIANTS(name)                    \
  namespace dc::cpu::baseline {                      \
  decltype(::dc::cpu::name) name;                    \
  }                                                  \
  namespace dc::cpu::avx2 {                          \
  decltype(::dc::cpu::name) name;                    \
  }
DC_DECLARE_VARIANTS(matmul_nt)
DC_DECLARE_VARIANTS(matmul_tn)
DC_DECLARE_VARIANTS(rms_norm)
DC_DECLARE_VARIANTS(rope_apply)
DC_DECLARE_VARIANTS(swiglu)
DC_DECLARE_VARIANTS(add_inplace)
DC_DECLARE_VARIANTS(scale)
DC_DECLARE_VARIANTS(zero_fill)
DC_DECLARE_VARIANTS(embedding)
DC_DECLARE_VARIANTS(attention)
DC_DECLARE_VARIANTS(attention_window)
DC_DECLARE_VARIANTS(rms_norm_backward)
DC_DECLARE_VARIANTS(rope_backward)
DC_DECLARE_VARIANTS(swiglu_backward)
DC_DECLARE_VARIANTS(embedding_backward)
DC_DECLARE_VARIANTS(transpose)
DC_DECLARE_VARIANTS(attention_backward)
DC_DECLARE_VARIANTS(cross_entropy)
#undef DC_DECLARE_VARIANTS

namespace dc::cpu {
namespace {

bool use_avx2() { return cpu_level() >= CpuLevel::kAvx2; }

}  // namespace

// `return (use_avx2() ? avx2::f : baseline::f)(args...)` for every kernel.
#define DC_DISPATCH(name, ...) return (use_avx2() ? avx2::name : baseline::name)(__VA_ARGS__)

void matmul_nt(ThreadPool* pool, const float* x, int64_t n, const WeightView& w, const float* bias, float* y,
               bool accumulate) {
  DC_DISPATCH(matmul_nt, pool, x, n, w, bias, y, accumulate);
}
void matmul_tn(ThreadPool* pool, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y,
               bool accumulate) {
  DC_DISPATCH(matmul_tn, pool, a, n, m, b, k, y, accumulate);
}
void rms_norm(ThreadPool* pool, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y) {
  DC_DISPATCH(rms_norm, pool, x, w, n, d, eps, y);
}
void rope_apply(ThreadPool* pool, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                const float* sin, bool inverse) {
  DC_DISPATCH(rope_apply, pool, x, n, n_heads, head_dim, cos, sin, inverse);
}
void swiglu(ThreadPool* pool, const float* gate, const float* up, int64_t count, float* out) {
  DC_DISPATCH(swiglu, pool, gate, up, count, out);
}
void add_inplace(ThreadPool* pool, float* y, const float* x, int64_t count) {
  DC_DISPATCH(add_inplace, pool, y, x, count);
}
void scale(ThreadPool* pool, const float* x, int64_t count, float s, float* y) { DC_DISPATCH(scale, pool, x, count, s, y); }
void zero_fill(ThreadPool* pool, float* y, int64_t count) { DC_DISPATCH(zero_fill, pool, y, count); }
void embedding(ThreadPool* pool, const WeightView& table, const int32_t* ids, int64_t n, float* out) {
  DC_DISPATCH(embedding, pool, table, ids, n, out);
}
void attention(ThreadPool* pool, const AttentionShape& shape, const float* q, const float* k, const float* v,
               const uint8_t* valid, float* out) {
  DC_DISPATCH(attention, pool, shape, q, k, v, valid, out);
}
void attention_window(ThreadPool* pool, const AttentionShape& shape, int64_t window_begin, int64_t window_len,
                      const float* q, const float* k, const float* v, const uint8_t* valid, float* out,
                      const int64_t* positions) {
  DC_DISPATCH(attention_window, pool, shape, window_begin, window_len, q, k, v, valid, out, positions);
}
void rms_norm_backward(ThreadPool* pool, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                       float eps, float* dx, float* dw) {
  DC_DISPATCH(rms_norm_backward, pool, x, w, dy, n, d, eps, dx, dw);
}
void rope_backward(ThreadPool* pool, float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin) {
  DC_DISPATCH(rope_backward, pool, dx, n, n_heads, head_dim, cos, sin);
}
void swiglu_backward(ThreadPool* pool, const float* gate, const float* up, const float* dout, int64_t count,
                     float* dgate, float* dup) {
  DC_DISPATCH(swiglu_backward, pool, gate, up, dout, count, dgate, dup);
}
void embedding_backward(ThreadPool* pool, const int32_t* ids, int64_t n, const float* dy, int64_t cols,
                        float* dtable) {
  DC_DISPATCH(embedding_backward, pool, ids, n, dy, cols, dtable);
}
void transpose(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, float* y) {
  DC_DISPATCH(transpose, pool, x, rows, cols, y);
}
void attention_backward(ThreadPool* pool, const AttentionShape& shape, const float* q, const float* k,
                        const float* v, const uint8_t* valid, const float* out, const float* dout, float* dq,
                        float* dk, float* dv) {
  DC_DISPATCH(attention_backward, pool, shape, q, k, v, valid, out, dout, dq, dk, dv);
}
double cross_entropy(ThreadPool* pool, const float* logits, const int32_t* targets, const float* weights, int64_t n,
                     int64_t n_vocab, float* dlogits, float* ce) {
  DC_DISPATCH(cross_entropy, pool, logits, targets, weights, n, n_vocab, dlogits, ce);
}

#undef DC_DISPATCH

}  // namespace dc::cpu
