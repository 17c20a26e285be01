// CPU kernels of the backward passes and the fused cross-entropy: raw pointers and sizes, no checks
// (the front-ends in ops/backward.cc check). The reference kernels are plain loops with f32 math, threaded;
// the *_fast ones AVX-512. Contracts in the op headers.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "core/workspace.h"
#include "ops/attention.h"

namespace dc::cpu {

void rms_norm_backward(ThreadPool* pool, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                       float eps, float* dx, float* dw);
void rope_backward(ThreadPool* pool, float* dx, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                   const float* sin);
void swiglu_backward(ThreadPool* pool, const float* gate, const float* up, const float* dout, int64_t count,
                     float* dgate, float* dup);
// AVX-512 versions (elementwise_backward_fast.cc; the reference kernels above without AVX-512), equal up
// to rounding (the row sums' order, the 2-ulp exp); dw of RMSNorm sums the rows in the reference's order.
void rms_norm_backward_fast(ThreadPool* pool, const float* x, const float* w, const float* dy, int64_t n, int64_t d,
                            float eps, float* dx, float* dw);
void swiglu_backward_fast(ThreadPool* pool, const float* gate, const float* up, const float* dout, int64_t count,
                          float* dgate, float* dup);
void embedding_backward(ThreadPool* pool, const int32_t* ids, int64_t n, const float* dy, int64_t cols,
                        float* dtable);
void attention_backward(ThreadPool* pool, const AttentionShape& shape, const float* q, const float* k,
                        const float* v, const uint8_t* valid, const float* out, const float* dout, float* dq,
                        float* dk, float* dv);
// The same as GEMMs through the fast matmul kernels (attention_backward_fast.cc), whose block buffers
// are the calling threads' of `ws`: in f32 equal up to summation order; with bf16 (AVX512_BF16 only) the
// softmax in f32 and the gradient products on bf16 operands with f32 sums (ops/attention.h).
void attention_backward_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& shape, const float* q, const float* k,
                             const float* v, const uint8_t* valid, const float* out, const float* dout, float* dq,
                             float* dk, float* dv, bool bf16);
double cross_entropy(ThreadPool* pool, const float* logits, const int32_t* targets, const float* weights, int64_t n,
                     int64_t n_vocab, float* dlogits, float* ce);
// The same in AVX-512 (loss_fast.cc; the reference without it): exp in f32 (2 ulp), sums in double.
double cross_entropy_fast(ThreadPool* pool, const float* logits, const int32_t* targets, const float* weights,
                          int64_t n, int64_t n_vocab, float* dlogits, float* ce);
// y[cols, rows] = x[rows, cols]ᵀ (f32), threaded over blocks.
void transpose(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, float* y);
// The same by 16×16 blocks in AVX-512 registers (transpose_fast.cc; falls back to transpose), and
// rounded to bf16 on the way (AVX512_BF16 only; transpose_to_bf16 of ops/matmul.h is its reference).
void transpose_fast(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, float* y);
void transpose_bf16_fast(ThreadPool* pool, const float* x, int64_t rows, int64_t cols, uint16_t* y);

}  // namespace dc::cpu
