// The f16 weights' block packing for the bf16 GEMM (matmul_fast.cc): each f16 weight is split exactly
// into two bf16 values, hi = bf16(w) (round to nearest even) and lo = w − hi (the residual has at most 4
// significant bits and f16's exponent range fits bf16's, so lo is exact: hi + lo == w for every finite w;
// an infinite w gives lo = NaN, so its products are NaN where the f32 path's are ±inf: non-finite either
// way). The GEMM runs its bf16 micro-kernels (vdpbf16ps or AMX tiles) over both panels and sums the two
// products in f32: x (bf16) · w exactly, at two bf16 products' cost instead of the f32 FMA path over
// widened weights. AVX512_BF16 only (cpu_has_avx512_bf16()).
#pragma once

#include <cstdint>

namespace dc::cpu {

// hi[p * 64 + c] / lo[p * 64 + c] = the bf16 pairs (hi or lo of w[c, k0 + 2p], w[c, k0 + 2p + 1]) for
// p < ⌈kc / 2⌉, rows c >= nj and an odd kc's last pair padded with 0: pack_pairs_bf16's layout. w: row c
// at w + c * ldw (f16 bits). `next` (or null): the first element of the block packed next (same row
// stride), prefetched into L2 meanwhile.
void pack_pairs_f16_split(const uint16_t* w, int64_t ldw, int64_t nj, int64_t k0, int64_t kc, const uint16_t* next,
                          uint32_t* hi, uint32_t* lo);

}  // namespace dc::cpu
