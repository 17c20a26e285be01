// CPU kernels: raw pointers and sizes, no checks (the op front-ends in ops/ check).
// Two sets: the reference kernels (plain loops, the test oracle; AVX2 + FMA or baseline, picked at run time)
// and the fast kernels (AVX-512, picked at run time; each falls back to its reference kernel on a CPU
// without the instructions it needs).
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/cpu_level.h"
#include "core/thread_pool.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/weight.h"

namespace dc::cpu {

// Reference kernels. matmul_nt with `accumulate`: y += x·wᵀ (bias must be null).
void matmul_nt(ThreadPool* pool, const float* x, int64_t n, const WeightView& w, const float* bias, float* y,
               bool accumulate = false);
void rms_norm(ThreadPool* pool, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y);
// y[m, k] = aᵀ·b (accumulate: y += aᵀ·b) in f32: matmul_tn_add / matmul_tn (ops/matmul.h).
void matmul_tn(ThreadPool* pool, const float* a, int64_t n, int64_t m, const float* b, int64_t k, float* y,
               bool accumulate);
// inverse: rotate by −θ instead of θ (the rotation's transpose: RoPE's backward, ops/cpu/backward_kernels.h).
void rope_apply(ThreadPool* pool, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                const float* sin, bool inverse = false);
void swiglu(ThreadPool* pool, const float* gate, const float* up, int64_t count, float* out);
void add_inplace(ThreadPool* pool, float* y, const float* x, int64_t count);
void scale(ThreadPool* pool, const float* x, int64_t count, float s, float* y);
void zero_fill(ThreadPool* pool, float* y, int64_t count);
// ops/dropout.h dropout_hashed with its threshold and 1/(1 − p) (one variant: dropout.cc).
void dropout(ThreadPool* pool, const float* x, int64_t n, int64_t d, uint64_t seed, uint64_t threshold, float keep_scale,
             float* y);
void embedding(ThreadPool* pool, const WeightView& table, const int32_t* ids, int64_t n, float* out);
void attention(ThreadPool* pool, const AttentionShape& shape, const float* q, const float* k, const float* v,
               const uint8_t* valid, float* out);
// positions: [window_len] the queries' absolute positions (ascending), or nullptr for window_begin + i.
void attention_window(ThreadPool* pool, const AttentionShape& shape, int64_t window_begin, int64_t window_len,
                      const float* q, const float* k, const float* v, const uint8_t* valid, float* out,
                      const int64_t* positions);

// The CPU level (core/cpu_level.h) as the kernels see it. The reference kernels above are the portable
// kernels, compiled twice (core/kernel_variant.h, kernels_avx2.cc): kAvx2 and up run their AVX2 + FMA
// variant, kBaseline their x86-64 baseline one.
bool cpu_has_avx2();         // cpu_level() >= kAvx2: AVX2 + FMA
bool cpu_has_avx512();       // >= kAvx512: AVX-512 F, BW, VL, DQ (+ AVX2, FMA, F16C)
bool cpu_has_avx512_bf16();  // >= kAvx512Bf16: the above plus AVX512_BF16 (vdpbf16ps)
bool cpu_has_amx_bf16();     // >= kAmx: the above plus AMX-TILE / AMX-BF16, with the OS's leave to use the tiles
// Tests only: while on, the level is capped at kAvx2, so the fast kernels take their portable fallbacks.
void force_portable_kernels_for_testing(bool on);

// Fast kernels: same contracts as the reference kernels above (see the op headers), same results up to
// summation order, except matmul_nt_fast with MatmulPrecision::kBF16 over bf16 or f16 weights
// (activations rounded to bf16; f16 weights exact, split into bf16 hi + lo). Results do not depend on the number of threads. Their block buffers are the calling
// threads' buffers of `ws` (Workspace::thread_buffer: the context's, or the op call's own).
void matmul_nt_fast(ThreadPool* pool, Workspace& ws, const float* x, int64_t n, const WeightView& w, const float* bias,
                    float* y, MatmulPrecision precision, bool accumulate = false);
// matmul_tn on bf16 operands (rounded on the way, a and b read in place) with f32 sums, AMX-BF16
// tiles where cpu_has_amx_bf16(); AVX512_BF16 only (matmul_tn_fast.cc).
void matmul_tn_fast(ThreadPool* pool, Workspace& ws, const float* a, int64_t n, int64_t m, const float* b, int64_t k,
                    float* y, bool accumulate);
// Panels [panel_begin, panel_end) of the kPanels copy (ops/weight.h) of the row-major bf16 weight w, into
// out (the whole copy: ⌈w.rows/64⌉ · ⌈w.cols/2⌉ · 64 words, 64-byte aligned).
void pack_panels_bf16(ThreadPool* pool, const WeightView& w, int64_t panel_begin, int64_t panel_end, uint32_t* out);
// adamw_update_panels (ops/adamw.h); AVX512_BF16 only (its reference: adamw_value, then pack_panels).
void adamw_update_panels_fast(ThreadPool* pool, Workspace& ws, const AdamWStep& s, float* p, const float* g, float* m, float* v,
                              int64_t rows, int64_t cols, uint32_t* w_panels);
void rms_norm_fast(ThreadPool* pool, const float* x, const float* w, int64_t n, int64_t d, float eps, float* y);
void rope_apply_fast(ThreadPool* pool, float* x, int64_t n, int64_t n_heads, int64_t head_dim, const float* cos,
                     const float* sin, bool inverse = false);
void swiglu_fast(ThreadPool* pool, const float* gate, const float* up, int64_t count, float* out);
void add_inplace_fast(ThreadPool* pool, float* y, const float* x, int64_t count);
void zero_fill_fast(ThreadPool* pool, float* y, int64_t count);
void attention_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& shape, const float* q, const float* k, const float* v,
                    const uint8_t* valid, float* out);
void attention_window_fast(ThreadPool* pool, Workspace& ws, const AttentionShape& shape, int64_t window_begin, int64_t window_len,
                           const float* q, const float* k, const float* v, const uint8_t* valid, float* out,
                           const int64_t* positions);

}  // namespace dc::cpu
