// sgemm split across threads (see gemm.h). The larger of m and n is cut into
// slabs (about four per thread, at least 64 rows or columns); each slab is an
// independent cblas_sgemm on its slices of A or B and C.
#include "backends/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "core/parallel.h"

namespace lathe::cpu {
namespace {

void blas_one_thread() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

void call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta · C; BLAS would reject the zero leading dimensions
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  blas_one_thread();
  const int64_t threads = omp_in_parallel() ? 1 : num_threads();
  if (threads <= 1 || m * n * k < (int64_t{1} << 18)) return call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const bool split_m = m >= n;
  const int64_t len = split_m ? m : n;
  // A few slabs per thread, handed out dynamically: a core slowed by a
  // neighbour does not hold the others back.
  const int64_t slab = std::max<int64_t>(64, (len / (4 * threads) + 15) / 16 * 16);
  const int64_t slabs = (len + slab - 1) / slab;
#pragma omp parallel for num_threads(int(std::min(threads, slabs))) schedule(dynamic, 1)
  for (int64_t s = 0; s < slabs; ++s) {
    const int64_t i0 = s * slab, cnt = std::min(slab, len - i0);
    if (split_m) {
      const float* as = trans_a ? a + i0 : a + i0 * lda;
      call(trans_a, trans_b, cnt, n, k, alpha, as, lda, b, ldb, beta, c + i0 * ldc, ldc);
    } else {
      const float* bs = trans_b ? b + i0 * ldb : b + i0;
      call(trans_a, trans_b, m, cnt, k, alpha, a, lda, bs, ldb, beta, c + i0, ldc);
    }
  }
}

}  // namespace lathe::cpu
