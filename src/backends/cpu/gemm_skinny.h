// Internal to the CPU backend: f32 GEMM for products with one small
// dimension, LoRA's shapes at rank r (tokens n, features in/out):
//   x·Aᵀ [n, r], u·Bᵀ [n, out] (k = r), dy·B [n, r], duᵀ·x [r, in] and
//   dyᵀ·u [out, r] (k = n tokens), du·A [n, in] (k = r).
// OpenBLAS runs these at a fraction of its large-GEMM rate (its blocking and
// packing are sized for big squares, and sgemm() splits them over threads
// by slabs). Here an AVX-512 register tile of MR rows x 16·NV columns reads
// op(A) through strides (a transposed A costs nothing: its elements are
// broadcast one at a time) and B rows as vectors; a transposed B (small: a
// LoRA factor) is transposed into per-thread scratch first. No packing of
// A, no k blocking (the k panel of B stays in L2); the threads share tiles
// of 64 rows x one register-tile width. Each C element is one f32 sum over
// k in order, scaled by alpha, plus beta·C (C is not read when beta is 0).
// Without AVX-512 it is sgemm (gemm.h). Measured (bench_gemm_bf16): ahead
// of OpenBLAS for x·Aᵀ on Zen 4 and a Sapphire Rapids Xeon; behind it on
// the Xeon for the products with k or C's width equal to the rank, so LoRA
// calls it for x·Aᵀ only.
#pragma once

#include <cstdint>

namespace lathe::cpu {

// Same contract as sgemm (gemm.h): C[m, n] = alpha · op(A) · op(B) + beta · C.
void sgemm_skinny(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace lathe::cpu
