// CPU kernels: raw pointers and sizes, no checks (the op front-ends in ops/ check).
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/weight.h"

namespace dc::cpu {

void matmul_nt(ThreadPool* pool, const float* x, int64_t n, const WeightView& w, const float* bias, float* y);
void rms_norm(ThreadPool* pool, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y);
void rope_apply(ThreadPool* pool, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                const float* sin);
void swiglu(ThreadPool* pool, const float* gate, const float* up, int64_t count, float* out);
void add_inplace(ThreadPool* pool, float* y, const float* x, int64_t count);
void embedding(ThreadPool* pool, const WeightView& table, const int32_t* ids, int64_t n, float* out);
void attention(ThreadPool* pool, const AttentionShape& shape, const float* q, const float* k, const float* v,
               const uint8_t* valid, float* out);

}  // namespace dc::cpu
