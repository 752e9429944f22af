// Internal to the CPU backend: row-major sgemm through OpenBLAS, split across
// OpenMP threads by this code (OpenBLAS itself runs single-threaded, so one
// pool owns the cores). Inside a parallel region, or for small products, it
// is one plain call on the calling thread. Allocates nothing.
#pragma once

#include <cstdint>

namespace lathe::cpu {

// C[m, n] = alpha · op(A) · op(B) + beta · C, op(X) = Xᵀ when trans_x.
// A is [m, k] ([k, m] when trans_a), B is [k, n] ([n, k] when trans_b).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace lathe::cpu
