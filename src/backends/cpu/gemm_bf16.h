// Internal to the CPU backend: GEMM with a bf16 right operand and f32 in and
// out, for training's frozen base under bf16 mixed precision.
//   C[m, n] = alpha · round_bf16(A)[m, k] · op(B) (+ C when accumulate)
// A is f32 [m, k] (rounded to bf16, nearest-even, while it is packed); B is
// bf16, [n, k] when trans_b (a weight W in y = x·Wᵀ) or [k, n] otherwise (W
// in dx = dy·W). Products are exact in f32 and sums accumulate in f32.
//
// With AVX512-BF16 (vdpbf16ps) the operands are packed into panels, pairs
// of k side by side in each 32-bit lane, and an 8 x 32 register tile does
// the work; the threads share the columns. Without it, B is widened to f32 a
// block at a time and multiplied by sgemm (A then stays f32: the portable
// path is slower and slightly more exact, never different in meaning).
// Scratch is per thread and kept from call to call: steady state allocates
// nothing. cpu::has_avx512_bf16() (cpu_ops.h) says which path runs.
#pragma once

#include <cstdint>

namespace lathe::cpu {

void gemm_bf16(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const uint16_t* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace lathe::cpu
